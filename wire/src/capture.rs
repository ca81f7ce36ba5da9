//! Captures: the pcapng blocks the daemon writes ([`pcapng`]), and reading
//! captures back ([`CaptureReader`]): the daemon's pcapng (any byte order, several
//! sections, `if_tsresol`, `epb_flags`) and classic pcap (µs or ns, either
//! byte order), one record at a time, for `vhost-rdma check-capture` and the
//! tests that replay golden captures. Malformed input is an error, never a panic.

use std::io::{self, Read};

/// Blocks (pcapng) or records (pcap) longer than this are refused.
pub const MAX_BLOCK: usize = 64 << 20;

/// One capture interface (pcapng IDB; classic pcap has one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// `if_name`, else `ifN` (N: its index in the file).
    pub name: String,
    /// Link type (1: Ethernet).
    pub linktype: u16,
    /// Snap length (0: none).
    pub snaplen: u32,
    /// Timestamp units per second.
    units: u64,
}

/// One captured frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// Index into [`CaptureReader::interfaces`].
    pub iface: usize,
    /// Timestamp (ns since the epoch).
    pub ts_ns: u64,
    /// Length of the frame on the wire.
    pub orig_len: u32,
    /// `epb_flags` (pcapng; 0 when absent): direction in bits 0-1
    /// (1 inbound, 2 outbound).
    pub flags: u32,
    /// The captured bytes (shorter than `orig_len` when cut by the snap
    /// length).
    pub data: Vec<u8>,
}

impl Packet {
    /// Whether the whole frame was captured.
    pub fn whole(&self) -> bool {
        self.data.len() as u64 >= u64::from(self.orig_len)
    }
}

/// Why a capture could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Reading failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// Neither pcapng nor classic pcap.
    #[error("not a pcapng or pcap file (starts with {0:02x?})")]
    Format([u8; 4]),
    /// A block or record is malformed.
    #[error("byte {offset}: {what}")]
    Malformed {
        /// Where the block or record starts.
        offset: u64,
        /// What is wrong.
        what: String,
    },
    /// The file ends inside a block or record (a capture still being
    /// written, or cut): the packets before it were read.
    #[error("byte {offset}: the file ends inside a {what} (cut short?)")]
    Truncated {
        /// Where the block or record starts.
        offset: u64,
        /// Block or record.
        what: &'static str,
    },
}

#[derive(Debug, Clone, Copy)]
enum Format {
    /// pcapng; `be`: the current section is big endian; `base`: index of
    /// its first interface.
    Pcapng { be: bool, base: usize },
    /// Classic pcap.
    Pcap { be: bool, nanos: bool },
}

/// Reads a pcapng or classic pcap file record by record.
#[derive(Debug)]
pub struct CaptureReader<R> {
    r: R,
    format: Format,
    ifaces: Vec<Interface>,
    offset: u64,
}

const SHB: u32 = 0x0a0d_0d0a;
const BYTE_ORDER: u32 = 0x1a2b_3c4d;

fn u16_at(b: &[u8], o: usize, be: bool) -> u16 {
    let a = [b[o], b[o + 1]];
    if be {
        u16::from_be_bytes(a)
    } else {
        u16::from_le_bytes(a)
    }
}

fn u32_at(b: &[u8], o: usize, be: bool) -> u32 {
    let a = [b[o], b[o + 1], b[o + 2], b[o + 3]];
    if be {
        u32::from_be_bytes(a)
    } else {
        u32::from_le_bytes(a)
    }
}

/// Reads exactly `buf.len()` bytes: `Ok(false)` at a clean end of file
/// (nothing read), `Truncated` when it ends part way.
fn fill<R: Read>(
    r: &mut R,
    buf: &mut [u8],
    offset: u64,
    what: &'static str,
) -> Result<bool, ReadError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(ReadError::Truncated { offset, what }),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

/// pcapng options in `b`: (code, value), up to `opt_endofopt`.
fn options(b: &[u8], be: bool) -> Vec<(u16, &[u8])> {
    let mut v = Vec::new();
    let mut o = 0;
    while o + 4 <= b.len() {
        let (code, len) = (u16_at(b, o, be), usize::from(u16_at(b, o + 2, be)));
        if code == 0 || o + 4 + len > b.len() {
            break;
        }
        v.push((code, &b[o + 4..o + 4 + len]));
        o += 4 + len.div_ceil(4) * 4;
    }
    v
}

/// Timestamp units per second from `if_tsresol`.
fn units(tsresol: Option<u8>) -> Option<u64> {
    let Some(r) = tsresol else {
        return Some(1_000_000);
    };
    let e = u32::from(r & 0x7f);
    if r & 0x80 != 0 {
        1u64.checked_shl(e)
    } else {
        10u64.checked_pow(e)
    }
}

fn to_ns(ts: u64, units: u64) -> u64 {
    (u128::from(ts) * 1_000_000_000 / u128::from(units.max(1))) as u64
}

impl<R: Read> CaptureReader<R> {
    /// Reads the file header (pcapng: the first Section Header Block).
    pub fn new(mut r: R) -> Result<Self, ReadError> {
        let mut magic = [0u8; 4];
        if !fill(&mut r, &mut magic, 0, "file header")? {
            return Err(ReadError::Format([0; 4]));
        }
        let m = u32::from_le_bytes(magic);
        let mut me = CaptureReader {
            r,
            format: Format::Pcapng { be: false, base: 0 },
            ifaces: Vec::new(),
            offset: 0,
        };
        match m {
            SHB => {
                me.section(magic)?;
            }
            0xa1b2_c3d4 | 0xa1b2_3c4d | 0xd4c3_b2a1 | 0x4d3c_b2a1 => {
                let be = matches!(m, 0xd4c3_b2a1 | 0x4d3c_b2a1);
                let nanos = matches!(m, 0xa1b2_3c4d | 0x4d3c_b2a1);
                let mut h = [0u8; 20];
                if !fill(&mut me.r, &mut h, 0, "file header")? {
                    return Err(ReadError::Truncated {
                        offset: 0,
                        what: "file header",
                    });
                }
                me.format = Format::Pcap { be, nanos };
                me.ifaces.push(Interface {
                    name: "if0".into(),
                    linktype: (u32_at(&h, 16, be) & 0xffff) as u16,
                    snaplen: u32_at(&h, 12, be),
                    units: if nanos { 1_000_000_000 } else { 1_000_000 },
                });
                me.offset = 24;
            }
            _ => return Err(ReadError::Format(magic)),
        }
        Ok(me)
    }

    /// The interfaces described so far (pcapng: more may follow).
    pub fn interfaces(&self) -> &[Interface] {
        &self.ifaces
    }

    /// Reads a pcapng block whose type field was `kind`: (type, body
    /// without the length fields) in the current byte order.
    fn block(&mut self, kind: [u8; 4]) -> Result<(u32, Vec<u8>), ReadError> {
        let offset = self.offset;
        let mut len = [0u8; 4];
        if !fill(&mut self.r, &mut len, offset, "block")? {
            return Err(ReadError::Truncated {
                offset,
                what: "block",
            });
        }
        let be = if u32::from_le_bytes(kind) == SHB {
            // The byte-order magic decides, and it follows the length.
            let mut bom = [0u8; 4];
            if !fill(&mut self.r, &mut bom, offset, "block")? {
                return Err(ReadError::Truncated {
                    offset,
                    what: "block",
                });
            }
            let be = match u32::from_le_bytes(bom) {
                BYTE_ORDER => false,
                x if x.swap_bytes() == BYTE_ORDER => true,
                _ => {
                    return Err(ReadError::Malformed {
                        offset,
                        what: format!("section header with byte-order magic {bom:02x?}"),
                    })
                }
            };
            let total = u32_at(&len, 0, be) as usize;
            return self.block_body(offset, SHB, total, be, Some(bom));
        } else {
            match self.format {
                Format::Pcapng { be, .. } => be,
                Format::Pcap { .. } => unreachable!("pcapng blocks in a pcap"),
            }
        };
        let total = u32_at(&len, 0, be) as usize;
        self.block_body(offset, u32_at(&kind, 0, be), total, be, None)
    }

    fn block_body(
        &mut self,
        offset: u64,
        kind: u32,
        total: usize,
        be: bool,
        head: Option<[u8; 4]>,
    ) -> Result<(u32, Vec<u8>), ReadError> {
        if total < 12 || total % 4 != 0 || total > MAX_BLOCK || (head.is_some() && total < 28) {
            return Err(ReadError::Malformed {
                offset,
                what: format!("block of type {kind:#x} with length {total}"),
            });
        }
        let mut rest = vec![0u8; total - 8 - head.map_or(0, |h| h.len())];
        if !fill(&mut self.r, &mut rest, offset, "block")? {
            return Err(ReadError::Truncated {
                offset,
                what: "block",
            });
        }
        let trailer = u32_at(&rest, rest.len() - 4, be) as usize;
        if trailer != total {
            return Err(ReadError::Malformed {
                offset,
                what: format!("block length {total}, trailing length {trailer}"),
            });
        }
        rest.truncate(rest.len() - 4);
        let body = match head {
            Some(h) => {
                let mut b = h.to_vec();
                b.extend_from_slice(&rest);
                b
            }
            None => rest,
        };
        self.offset += total as u64;
        Ok((kind, body))
    }

    /// Starts a section from its SHB (type field already read).
    fn section(&mut self, kind: [u8; 4]) -> Result<(), ReadError> {
        let offset = self.offset;
        let (_, body) = self.block(kind)?;
        let be = u32_at(&body, 0, false) != BYTE_ORDER;
        let major = u16_at(&body, 4, be);
        if major != 1 {
            return Err(ReadError::Malformed {
                offset,
                what: format!("pcapng major version {major}"),
            });
        }
        self.format = Format::Pcapng {
            be,
            base: self.ifaces.len(),
        };
        Ok(())
    }

    /// The next packet; `None` at the end of the file.
    pub fn next_packet(&mut self) -> Result<Option<Packet>, ReadError> {
        loop {
            let offset = self.offset;
            match self.format {
                Format::Pcap { be, nanos } => {
                    let mut h = [0u8; 16];
                    if !fill(&mut self.r, &mut h, offset, "record")? {
                        return Ok(None);
                    }
                    let incl = u32_at(&h, 8, be) as usize;
                    if incl > MAX_BLOCK {
                        return Err(ReadError::Malformed {
                            offset,
                            what: format!("record of {incl} bytes"),
                        });
                    }
                    let mut data = vec![0u8; incl];
                    if incl > 0 && !fill(&mut self.r, &mut data, offset, "record")? {
                        return Err(ReadError::Truncated {
                            offset,
                            what: "record",
                        });
                    }
                    self.offset += 16 + incl as u64;
                    let (s, frac) = (u64::from(u32_at(&h, 0, be)), u64::from(u32_at(&h, 4, be)));
                    let ts_ns = s * 1_000_000_000 + if nanos { frac } else { frac * 1000 };
                    return Ok(Some(Packet {
                        iface: 0,
                        ts_ns,
                        orig_len: u32_at(&h, 12, be),
                        flags: 0,
                        data,
                    }));
                }
                Format::Pcapng { be, base } => {
                    let mut kind = [0u8; 4];
                    if !fill(&mut self.r, &mut kind, offset, "block")? {
                        return Ok(None);
                    }
                    if u32::from_le_bytes(kind) == SHB {
                        self.section(kind)?;
                        continue;
                    }
                    let (k, b) = self.block(kind)?;
                    let short = |what: &str| ReadError::Malformed {
                        offset,
                        what: format!("short {what}"),
                    };
                    match k {
                        1 => {
                            if b.len() < 8 {
                                return Err(short("interface description"));
                            }
                            let opts = options(&b[8..], be);
                            let name = opts
                                .iter()
                                .find(|(c, _)| *c == 2)
                                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                                .unwrap_or_else(|| format!("if{}", self.ifaces.len()));
                            let tsresol = opts
                                .iter()
                                .find(|(c, v)| *c == 9 && !v.is_empty())
                                .map(|(_, v)| v[0]);
                            let units = units(tsresol).ok_or_else(|| ReadError::Malformed {
                                offset,
                                what: format!("if_tsresol {tsresol:?}"),
                            })?;
                            self.ifaces.push(Interface {
                                name,
                                linktype: u16_at(&b, 0, be),
                                snaplen: u32_at(&b, 4, be),
                                units,
                            });
                        }
                        6 | 2 => {
                            // Enhanced Packet Block; 2: the obsolete Packet
                            // Block (16-bit interface id and drops count).
                            if b.len() < 20 {
                                return Err(short("packet block"));
                            }
                            let id = if k == 6 {
                                u32_at(&b, 0, be) as usize
                            } else {
                                usize::from(u16_at(&b, 0, be))
                            };
                            let cap = u32_at(&b, 12, be) as usize;
                            if 20 + cap > b.len() {
                                return Err(short("packet block data"));
                            }
                            let iface = base + id;
                            let Some(i) = self.ifaces.get(iface).filter(|_| iface >= base) else {
                                return Err(ReadError::Malformed {
                                    offset,
                                    what: format!("packet of interface {id}, not described"),
                                });
                            };
                            let ts =
                                (u64::from(u32_at(&b, 4, be)) << 32) | u64::from(u32_at(&b, 8, be));
                            let opts_at = (20 + cap.div_ceil(4) * 4).min(b.len());
                            let flags = options(&b[opts_at..], be)
                                .iter()
                                .find(|(c, v)| *c == 2 && v.len() == 4)
                                .map_or(0, |(_, v)| u32_at(v, 0, be));
                            return Ok(Some(Packet {
                                iface,
                                ts_ns: to_ns(ts, i.units),
                                orig_len: u32_at(&b, 16, be),
                                flags,
                                data: b[20..20 + cap].to_vec(),
                            }));
                        }
                        3 => {
                            // Simple Packet Block: interface 0 of the section.
                            if b.len() < 4 {
                                return Err(short("simple packet block"));
                            }
                            let Some(i) = self.ifaces.get(base) else {
                                return Err(ReadError::Malformed {
                                    offset,
                                    what: "simple packet block with no interface".into(),
                                });
                            };
                            let orig_len = u32_at(&b, 0, be);
                            let cap = (orig_len as usize).min(b.len() - 4).min(if i.snaplen > 0 {
                                i.snaplen as usize
                            } else {
                                usize::MAX
                            });
                            return Ok(Some(Packet {
                                iface: base,
                                ts_ns: 0,
                                orig_len,
                                flags: 0,
                                data: b[4..4 + cap].to_vec(),
                            }));
                        }
                        _ => {} // statistics, name resolution, custom blocks
                    }
                }
            }
        }
    }
}

/// Writing pcapng: the blocks the daemon's captures are made of (little
/// endian), which [`CaptureReader`] reads back.
pub mod pcapng {
    /// Link type Ethernet.
    pub const LINKTYPE_ETHERNET: u16 = 1;
    /// `epb_flags` direction: inbound.
    pub const FLAG_INBOUND: u32 = 1;
    /// `epb_flags` direction: outbound.
    pub const FLAG_OUTBOUND: u32 = 2;

    fn pad4(v: &mut Vec<u8>) {
        while v.len() % 4 != 0 {
            v.push(0);
        }
    }

    fn option(v: &mut Vec<u8>, code: u16, val: &[u8]) {
        v.extend_from_slice(&code.to_le_bytes());
        v.extend_from_slice(&(val.len() as u16).to_le_bytes());
        v.extend_from_slice(val);
        pad4(v);
    }

    fn block(kind: u32, body: &[u8]) -> Vec<u8> {
        let len = (12 + body.len()) as u32;
        let mut v = Vec::with_capacity(len as usize);
        v.extend_from_slice(&kind.to_le_bytes());
        v.extend_from_slice(&len.to_le_bytes());
        v.extend_from_slice(body);
        v.extend_from_slice(&len.to_le_bytes());
        v
    }

    /// Section Header Block (section length unknown).
    pub fn shb(app: &str) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&(-1i64).to_le_bytes());
        option(&mut b, 4, app.as_bytes()); // shb_userappl
        option(&mut b, 0, &[]);
        block(0x0a0d_0d0a, &b)
    }

    /// Interface Description Block: Ethernet, `if_name`, nanosecond
    /// timestamps (`if_tsresol` 9).
    pub fn idb(name: &str, snaplen: u32) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&snaplen.to_le_bytes());
        option(&mut b, 2, name.as_bytes()); // if_name
        option(&mut b, 9, &[9]); // if_tsresol: 10^-9
        option(&mut b, 0, &[]);
        block(1, &b)
    }

    /// Enhanced Packet Block with `epb_flags`.
    pub fn epb(iface: u32, ts_ns: u64, data: &[u8], orig_len: u32, flags: u32) -> Vec<u8> {
        let mut b = Vec::with_capacity(data.len() + 40);
        b.extend_from_slice(&iface.to_le_bytes());
        b.extend_from_slice(&((ts_ns >> 32) as u32).to_le_bytes());
        b.extend_from_slice(&(ts_ns as u32).to_le_bytes());
        b.extend_from_slice(&(data.len() as u32).to_le_bytes());
        b.extend_from_slice(&orig_len.to_le_bytes());
        b.extend_from_slice(data);
        pad4(&mut b);
        option(&mut b, 2, &flags.to_le_bytes()); // epb_flags
        option(&mut b, 0, &[]);
        block(6, &b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le_file() -> Vec<u8> {
        let mut f = pcapng::shb("test");
        f.extend(pcapng::idb("a", 2000));
        f.extend(pcapng::idb("b", 64));
        f.extend(pcapng::epb(
            1,
            1_500_000_000_123,
            &[1, 2, 3],
            3,
            pcapng::FLAG_OUTBOUND,
        ));
        f.extend(pcapng::epb(0, 7, &[9; 64], 100, pcapng::FLAG_INBOUND));
        f
    }

    fn all<R: Read>(r: &mut CaptureReader<R>) -> Vec<Packet> {
        std::iter::from_fn(|| r.next_packet().unwrap()).collect()
    }

    #[test]
    fn reads_what_the_writer_writes() {
        let f = le_file();
        let mut r = CaptureReader::new(&f[..]).unwrap();
        let p = all(&mut r);
        let names: Vec<_> = r
            .interfaces()
            .iter()
            .map(|i| (i.name.as_str(), i.snaplen, i.linktype))
            .collect();
        assert_eq!(names, [("a", 2000, 1), ("b", 64, 1)]);
        assert_eq!(p.len(), 2);
        assert_eq!(
            (p[0].iface, p[0].ts_ns, p[0].flags),
            (1, 1_500_000_000_123, 2)
        );
        assert_eq!(p[0].data, [1, 2, 3]);
        assert!(p[0].whole());
        assert_eq!((p[1].iface, p[1].orig_len, p[1].data.len()), (0, 100, 64));
        assert!(!p[1].whole());
    }

    #[test]
    fn a_second_section_numbers_its_interfaces_after_the_first() {
        let mut f = le_file();
        f.extend(pcapng::shb("again"));
        f.extend(pcapng::idb("c", 0));
        f.extend(pcapng::epb(0, 1, &[5], 1, 0));
        let mut r = CaptureReader::new(&f[..]).unwrap();
        let p = all(&mut r);
        assert_eq!(p[2].iface, 2);
        assert_eq!(r.interfaces()[2].name, "c");
    }

    /// A big-endian section: every 32-bit and 16-bit field swapped.
    #[test]
    fn big_endian_sections_and_microseconds() {
        let mut f = Vec::new();
        let block = |kind: u32, body: &[u8]| {
            let len = (12 + body.len()) as u32;
            let mut v = kind.to_be_bytes().to_vec();
            v.extend(len.to_be_bytes());
            v.extend(body);
            v.extend(len.to_be_bytes());
            v
        };
        let mut shb = BYTE_ORDER.to_be_bytes().to_vec();
        shb.extend(1u16.to_be_bytes());
        shb.extend(0u16.to_be_bytes());
        shb.extend((-1i64).to_be_bytes());
        f.extend(block(SHB, &shb));
        let mut idb = 1u16.to_be_bytes().to_vec();
        idb.extend(0u16.to_be_bytes());
        idb.extend(0u32.to_be_bytes());
        f.extend(block(1, &idb)); // no if_tsresol: microseconds
        let mut epb = 0u32.to_be_bytes().to_vec();
        epb.extend(0u32.to_be_bytes());
        epb.extend(5u32.to_be_bytes());
        epb.extend(2u32.to_be_bytes());
        epb.extend(2u32.to_be_bytes());
        epb.extend([7, 8, 0, 0]);
        f.extend(block(6, &epb));
        let mut r = CaptureReader::new(&f[..]).unwrap();
        let p = all(&mut r);
        assert_eq!(r.interfaces()[0].name, "if0");
        assert_eq!((p[0].ts_ns, p[0].data.clone()), (5000, vec![7, 8]));
    }

    #[test]
    fn classic_pcap() {
        let mut f = 0xa1b2_3c4du32.to_le_bytes().to_vec(); // nanoseconds
        f.extend(2u16.to_le_bytes());
        f.extend(4u16.to_le_bytes());
        f.extend([0; 8]);
        f.extend(65535u32.to_le_bytes());
        f.extend(1u32.to_le_bytes());
        for (s, ns, d) in [(1u32, 2u32, &[1u8, 2][..]), (3, 4, &[3][..])] {
            f.extend(s.to_le_bytes());
            f.extend(ns.to_le_bytes());
            f.extend((d.len() as u32).to_le_bytes());
            f.extend((d.len() as u32).to_le_bytes());
            f.extend(d);
        }
        let mut r = CaptureReader::new(&f[..]).unwrap();
        let p = all(&mut r);
        assert_eq!(r.interfaces()[0].linktype, 1);
        assert_eq!((p[0].ts_ns, p[1].ts_ns), (1_000_000_002, 3_000_000_004));
        assert_eq!(p[1].data, [3]);
    }

    #[test]
    fn damage_is_an_error_not_a_panic() {
        let f = le_file();
        // Cut anywhere inside the last block: the first packet still reads.
        for cut in [f.len() - 1, f.len() - 40] {
            let mut r = CaptureReader::new(&f[..cut]).unwrap();
            assert!(r.next_packet().unwrap().is_some());
            assert!(matches!(r.next_packet(), Err(ReadError::Truncated { .. })));
        }
        assert!(matches!(
            CaptureReader::new(&b"GIF89a"[..]),
            Err(ReadError::Format(_))
        ));
        assert!(CaptureReader::new(&[][..]).is_err());
        // A wrong trailing length.
        let mut g = f.clone();
        let n = g.len();
        g[n - 4] ^= 0x10;
        let mut r = CaptureReader::new(&g[..]).unwrap();
        r.next_packet().unwrap();
        assert!(matches!(r.next_packet(), Err(ReadError::Malformed { .. })));
        // Every prefix and every single-byte change: errors at worst.
        for i in 0..f.len() {
            let mut h = f.clone();
            h[i] ^= 0xff;
            for bytes in [&f[..i], &h[..]] {
                if let Ok(mut r) = CaptureReader::new(bytes) {
                    while let Ok(Some(_)) = r.next_packet() {}
                }
            }
        }
    }
}
