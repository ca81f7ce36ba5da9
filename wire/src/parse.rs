//! Frame parsing for classification: Ethernet (+ one VLAN tag), IPv4 (with
//! options and fragments), IPv6 (with extension headers), TCP, UDP and the
//! RoCEv2 Base Transport Header.
//!
//! [`parse`] never panics and never fails: it returns whatever layers it could
//! validate. A layer that is truncated or malformed is reported as absent
//! (`None`), and so is every layer above it.
//!
//! The result, [`ParsedFrame`], is the one parsed view of a frame that every
//! stage of a switch can share: it is `Copy`, allocates nothing and holds
//! absolute offsets, so a frame is parsed once and each stage (steering, RSS,
//! flow rules, fault matching, ...) reads fields from the view instead of
//! walking the headers again.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::ethernet::{is_vlan_tpid, ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETH_HLEN, VLAN_HLEN};
use crate::ip::{IPPROTO_TCP, IPPROTO_UDP, IPV4_FRAG_OFFSET, IPV4_MF};
pub use crate::l4::L4Proto;
use crate::roce::{BTH_LEN, ROCEV2_PORT};

/// How many IPv6 extension headers are walked before giving up.
const MAX_EXT_HEADERS: usize = 16;
/// IPv6 Home Address destination option (RFC 6275 section 6.3).
const OPT_HOME_ADDRESS: u8 = 201;

/// A VLAN tag (one tag is parsed; a second tag stops parsing at L2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VlanTag {
    /// Tag protocol identifier (0x8100 or 0x88a8).
    pub tpid: u16,
    /// Tag control information (PCP, DEI, VID).
    pub tci: u16,
}

impl VlanTag {
    /// The 12-bit VLAN id.
    pub fn vid(&self) -> u16 {
        self.tci & 0x0fff
    }
}

/// The Ethernet layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct L2 {
    /// Destination MAC address.
    pub dst: [u8; 6],
    /// Source MAC address.
    pub src: [u8; 6],
    /// The VLAN tag, if one was present.
    pub vlan: Option<VlanTag>,
    /// The ethertype after the (optional) VLAN tag.
    pub ethertype: u16,
    /// Offset of the first byte after the Ethernet header (and tag).
    pub header_len: usize,
}

/// IPv4 header facts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Info {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// The protocol field.
    pub protocol: u8,
    /// Header length in bytes (IHL * 4, options included).
    pub header_len: usize,
    /// True if MF is set or the fragment offset is non-zero.
    pub fragment: bool,
}

/// IPv6 header and extension-header facts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Info {
    /// Source address from the fixed header.
    pub src: Ipv6Addr,
    /// Destination address from the fixed header.
    pub dst: Ipv6Addr,
    /// The upper-layer protocol (the last next-header value reached).
    pub protocol: u8,
    /// Bytes of the fixed header plus all extension headers walked.
    pub header_len: usize,
    /// True if at least one extension header was present.
    pub has_ext_headers: bool,
    /// Home address from a Home Address option in a Destination Options header.
    pub home_address: Option<Ipv6Addr>,
    /// The address carried by a type 2 Routing header.
    pub rt2_address: Option<Ipv6Addr>,
    /// True if a Fragment header marks a fragment (offset != 0 or M set).
    pub fragment: bool,
    /// True if the extension-header chain was truncated or too long: the
    /// upper-layer header is then unknown.
    pub ext_truncated: bool,
}

/// The IP layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L3 {
    /// IPv4.
    V4(Ipv4Info),
    /// IPv6.
    V6(Ipv6Info),
}

impl L3 {
    /// The upper-layer protocol number.
    pub fn protocol(&self) -> u8 {
        match self {
            L3::V4(i) => i.protocol,
            L3::V6(i) => i.protocol,
        }
    }

    /// True if this datagram is a fragment (ports are then never read).
    pub fn is_fragment(&self) -> bool {
        match self {
            L3::V4(i) => i.fragment,
            L3::V6(i) => i.fragment,
        }
    }

    /// Length of the IP header(s), IPv6 extension headers included.
    pub fn header_len(&self) -> usize {
        match self {
            L3::V4(i) => i.header_len,
            L3::V6(i) => i.header_len,
        }
    }
}

/// The transport layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct L4 {
    /// TCP or UDP.
    pub proto: L4Proto,
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Header length (TCP data offset * 4, or 8 for UDP).
    pub header_len: usize,
}

/// The fields of a RoCEv2 Base Transport Header (IBTA vol. 1, 9.2) that a
/// classifier matches on. The opcode is the raw byte: whether it names a
/// known operation is for the caller to decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceBth {
    /// The BTH opcode byte.
    pub opcode: u8,
    /// Destination queue pair (24 bits).
    pub dest_qp: u32,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

impl RoceBth {
    /// Reads the fields from the first [`BTH_LEN`] bytes of `b`.
    pub fn read(b: &[u8]) -> Option<Self> {
        let h = b.get(..BTH_LEN)?;
        Some(RoceBth {
            opcode: h[0],
            dest_qp: u32::from_be_bytes([0, h[5], h[6], h[7]]),
            psn: u32::from_be_bytes([0, h[9], h[10], h[11]]),
        })
    }
}

/// Everything [`parse`] learned about a frame, with absolute offsets: the
/// one view of a frame that classification stages share (see the module
/// documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ParsedFrame {
    /// Ethernet layer; `None` if the frame is shorter than 14 bytes (or 18
    /// with a tag).
    pub l2: Option<L2>,
    /// IP layer; `None` for non-IP or malformed IP.
    pub l3: Option<L3>,
    /// Offset of the IP header in the frame (valid if `l3` is `Some`).
    pub l3_offset: usize,
    /// Offset one past the IP datagram (total/payload length, clamped to the
    /// frame); Ethernet padding lies beyond it.
    pub l3_end: usize,
    /// Transport layer; `None` for fragments, other protocols or malformed.
    pub l4: Option<L4>,
    /// Offset of the transport header (valid if `l4` is `Some`).
    pub l4_offset: usize,
    /// The RoCEv2 BTH: present when `l4` is UDP to [`ROCEV2_PORT`] and the
    /// [`BTH_LEN`] bytes after the UDP header are in the frame. Like the
    /// RoCE parsers this replaces, they are read up to the frame's end, not
    /// the IP datagram's.
    pub bth: Option<RoceBth>,
}

impl ParsedFrame {
    /// The ethertype after the (optional) VLAN tag; `None` for a frame
    /// shorter than its Ethernet header.
    pub fn ethertype(&self) -> Option<u16> {
        self.l2.map(|l2| l2.ethertype)
    }

    /// The VLAN tag, if the frame has one.
    pub fn vlan(&self) -> Option<VlanTag> {
        self.l2.and_then(|l2| l2.vlan)
    }

    /// Source address of the IP header.
    pub fn src_ip(&self) -> Option<IpAddr> {
        self.l3.map(|l3| match l3 {
            L3::V4(i) => IpAddr::V4(i.src),
            L3::V6(i) => IpAddr::V6(i.src),
        })
    }

    /// Destination address of the IP header.
    pub fn dst_ip(&self) -> Option<IpAddr> {
        self.l3.map(|l3| match l3 {
            L3::V4(i) => IpAddr::V4(i.dst),
            L3::V6(i) => IpAddr::V6(i.dst),
        })
    }

    /// The upper-layer protocol (after IPv6 extension headers).
    pub fn ip_protocol(&self) -> Option<u8> {
        self.l3.map(|l3| l3.protocol())
    }

    /// TCP/UDP source and destination port.
    pub fn ports(&self) -> Option<(u16, u16)> {
        self.l4.map(|l4| (l4.src_port, l4.dst_port))
    }

    /// Whether this is a RoCEv2 packet: UDP to [`ROCEV2_PORT`] (whether or
    /// not a whole BTH follows).
    pub fn is_rocev2(&self) -> bool {
        self.l4
            .is_some_and(|l4| l4.proto == L4Proto::Udp && l4.dst_port == ROCEV2_PORT)
    }

    /// Offset one past all IP headers (IPv6 extension headers included).
    pub fn l3_header_end(&self) -> Option<usize> {
        self.l3.map(|l3| self.l3_offset + l3.header_len())
    }

    /// Offset one past the transport header.
    pub fn l4_header_end(&self) -> Option<usize> {
        self.l4.map(|l4| self.l4_offset + l4.header_len)
    }

    /// Where header/data split cuts this frame: the end of the TCP/UDP header,
    /// else the end of the IP headers for other IP, else `None` (non-IP).
    pub fn split_point(&self) -> Option<usize> {
        self.l4_header_end().or_else(|| self.l3_header_end())
    }

    /// Upper-layer payload length from the IP length fields (excludes
    /// Ethernet padding), counted from [`split_point`](Self::split_point).
    pub fn l4_payload_len(&self) -> Option<usize> {
        self.split_point()
            .map(|split| self.l3_end.saturating_sub(split))
    }
}

fn be16(b: &[u8], off: usize) -> Option<u16> {
    let s = b.get(off..off.checked_add(2)?)?;
    Some(u16::from_be_bytes([s[0], s[1]]))
}

fn addr16(b: &[u8], off: usize) -> Option<Ipv6Addr> {
    let s: [u8; 16] = b.get(off..off.checked_add(16)?)?.try_into().ok()?;
    Some(Ipv6Addr::from(s))
}

/// Calls of [`parse`] in this process (feature `parse-count`).
#[cfg(feature = "parse-count")]
static PARSE_CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times [`parse`] ran in this process, on any thread. Only with
/// the `parse-count` feature, which tests turn on to show that a path
/// parses each frame once; production builds leave it off and pay nothing.
#[cfg(feature = "parse-count")]
pub fn parse_calls() -> u64 {
    PARSE_CALLS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Parses `frame` as far as it is valid. Never panics.
pub fn parse(frame: &[u8]) -> ParsedFrame {
    #[cfg(feature = "parse-count")]
    PARSE_CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut out = ParsedFrame::default();
    let Some(l2) = parse_l2(frame) else {
        return out;
    };
    out.l2 = Some(l2);
    let off = l2.header_len;
    match l2.ethertype {
        ETHERTYPE_IPV4 => parse_ipv4(frame, off, &mut out),
        ETHERTYPE_IPV6 => parse_ipv6(frame, off, &mut out),
        _ => {}
    }
    if let Some(l3) = out.l3 {
        if !l3.is_fragment() {
            let l4_off = out.l3_offset + l3.header_len();
            if let Some(l4) = parse_l4(frame, l4_off, out.l3_end, l3.protocol()) {
                out.l4 = Some(l4);
                out.l4_offset = l4_off;
                if out.is_rocev2() {
                    out.bth = frame.get(l4_off + 8..).and_then(RoceBth::read);
                }
            }
        }
    }
    out
}

fn parse_l2(frame: &[u8]) -> Option<L2> {
    let dst: [u8; 6] = frame.get(0..6)?.try_into().ok()?;
    let src: [u8; 6] = frame.get(6..12)?.try_into().ok()?;
    let ty = be16(frame, 12)?;
    if is_vlan_tpid(ty) {
        let tci = be16(frame, 14)?;
        let inner = be16(frame, 16)?;
        return Some(L2 {
            dst,
            src,
            vlan: Some(VlanTag { tpid: ty, tci }),
            ethertype: inner,
            header_len: ETH_HLEN + VLAN_HLEN,
        });
    }
    Some(L2 {
        dst,
        src,
        vlan: None,
        ethertype: ty,
        header_len: ETH_HLEN,
    })
}

fn parse_ipv4(frame: &[u8], off: usize, out: &mut ParsedFrame) {
    let Some(h) = frame.get(off..off + 20) else {
        return;
    };
    if h[0] >> 4 != 4 {
        return;
    }
    let header_len = usize::from(h[0] & 0x0f) * 4;
    let total_len = usize::from(u16::from_be_bytes([h[2], h[3]]));
    let avail = frame.len() - off;
    if header_len < 20 || header_len > avail || total_len < header_len {
        return;
    }
    let frag = u16::from_be_bytes([h[6], h[7]]);
    let info = Ipv4Info {
        src: Ipv4Addr::new(h[12], h[13], h[14], h[15]),
        dst: Ipv4Addr::new(h[16], h[17], h[18], h[19]),
        protocol: h[9],
        header_len,
        fragment: frag & (IPV4_MF | IPV4_FRAG_OFFSET) != 0,
    };
    out.l3 = Some(L3::V4(info));
    out.l3_offset = off;
    out.l3_end = off + total_len.min(avail);
}

fn parse_ipv6(frame: &[u8], off: usize, out: &mut ParsedFrame) {
    let Some(h) = frame.get(off..off + 40) else {
        return;
    };
    if h[0] >> 4 != 6 {
        return;
    }
    let payload_len = usize::from(u16::from_be_bytes([h[4], h[5]]));
    let avail = frame.len() - off;
    // Payload length 0 with a Hop-by-Hop header may be a jumbogram (RFC
    // 2675): then the frame end bounds the datagram.
    let end = if payload_len == 0 && h[6] == 0 {
        frame.len()
    } else {
        off + (40 + payload_len).min(avail)
    };
    let (Some(src), Some(dst)) = (addr16(h, 8), addr16(h, 24)) else {
        return;
    };
    let mut info = Ipv6Info {
        src,
        dst,
        protocol: h[6],
        header_len: 40,
        has_ext_headers: false,
        home_address: None,
        rt2_address: None,
        fragment: false,
        ext_truncated: false,
    };
    walk_ext_headers(frame, off + 40, end, &mut info);
    out.l3 = Some(L3::V6(info));
    out.l3_offset = off;
    out.l3_end = end;
}

fn walk_ext_headers(frame: &[u8], mut pos: usize, end: usize, info: &mut Ipv6Info) {
    let start = pos - 40;
    let region = frame.get(..end).unwrap_or(frame);
    for _ in 0..MAX_EXT_HEADERS {
        let nh = info.protocol;
        let len = match nh {
            // Hop-by-Hop, Routing, Destination Options, Mobility, HIP, Shim6:
            // (Hdr Ext Len + 1) * 8 bytes.
            0 | 43 | 60 | 135 | 139 | 140 => {
                let Some(&l) = region.get(pos + 1) else {
                    info.ext_truncated = true;
                    return;
                };
                (usize::from(l) + 1) * 8
            }
            // Fragment header: fixed 8 bytes.
            44 => 8,
            // Authentication Header: (Payload Len + 2) * 4 bytes.
            51 => {
                let Some(&l) = region.get(pos + 1) else {
                    info.ext_truncated = true;
                    return;
                };
                (usize::from(l) + 2) * 4
            }
            _ => return,
        };
        let Some(ext) = region.get(pos..pos + len) else {
            info.ext_truncated = true;
            return;
        };
        info.has_ext_headers = true;
        match nh {
            60 if info.home_address.is_none() => {
                info.home_address = find_home_address(&ext[2..]);
            }
            // Type 2 routing header (RFC 6275 6.4): Hdr Ext Len 2, Segments
            // Left 1, 4 reserved bytes, one address.
            43 if ext[2] == 2 && len >= 24 && info.rt2_address.is_none() => {
                info.rt2_address = addr16(ext, 8);
            }
            44 => {
                let fo = u16::from_be_bytes([ext[2], ext[3]]);
                info.fragment = fo >> 3 != 0 || fo & 1 != 0;
            }
            _ => {}
        }
        info.protocol = ext[0];
        pos += len;
        info.header_len = pos - start;
        if info.fragment {
            return;
        }
    }
    // Too many extension headers: give up on the upper layer.
    info.ext_truncated = true;
}

fn find_home_address(mut opts: &[u8]) -> Option<Ipv6Addr> {
    while let Some(&ty) = opts.first() {
        if ty == 0 {
            opts = &opts[1..];
            continue;
        }
        let len = usize::from(*opts.get(1)?);
        let data = opts.get(2..2 + len)?;
        if ty == OPT_HOME_ADDRESS && len == 16 {
            return addr16(data, 0);
        }
        opts = &opts[2 + len..];
    }
    None
}

fn parse_l4(frame: &[u8], off: usize, end: usize, protocol: u8) -> Option<L4> {
    let region = frame.get(..end)?;
    match protocol {
        IPPROTO_TCP => {
            let h = region.get(off..off + 20)?;
            let header_len = usize::from(h[12] >> 4) * 4;
            if header_len < 20 || region.len() < off + header_len {
                return None;
            }
            Some(L4 {
                proto: L4Proto::Tcp,
                src_port: u16::from_be_bytes([h[0], h[1]]),
                dst_port: u16::from_be_bytes([h[2], h[3]]),
                header_len,
            })
        }
        IPPROTO_UDP => {
            let h = region.get(off..off + 8)?;
            Some(L4 {
                proto: L4Proto::Udp,
                src_port: u16::from_be_bytes([h[0], h[1]]),
                dst_port: u16::from_be_bytes([h[2], h[3]]),
                header_len: 8,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{FrameBuilder, Ipv6Ext};
    use crate::ethernet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_VLAN};
    use crate::ip::IPPROTO_UDP;
    use crate::roce::{BTH_LEN, ROCEV2_PORT};

    fn tcp4() -> Vec<u8> {
        FrameBuilder::tcp(
            "10.0.0.1".parse().unwrap(),
            1,
            "10.0.0.2".parse().unwrap(),
            2,
        )
        .build(b"abc")
    }

    #[test]
    fn layers_and_offsets() {
        let f = tcp4();
        let p = parse(&f);
        assert_eq!(p.l2.unwrap().ethertype, ETHERTYPE_IPV4);
        assert_eq!((p.l3_offset, p.l3_end), (14, f.len()));
        assert_eq!((p.l4_offset, p.split_point()), (34, Some(54)));
        assert_eq!(p.l4_payload_len(), Some(3));
        assert_eq!(p.l4.unwrap().proto, L4Proto::Tcp);
    }

    #[test]
    fn malformed_layers_are_absent() {
        let f = tcp4();
        // Truncated TCP header: IP stays, L4 goes.
        let p = parse(&f[..14 + 20 + 19]);
        assert!(p.l3.is_some() && p.l4.is_none());
        // TCP data offset < 5.
        let mut g = f.clone();
        g[34 + 12] = 0x40;
        assert!(parse(&g).l4.is_none());
        // TCP data offset beyond the datagram.
        g[34 + 12] = 0xf0;
        assert!(parse(&g).l4.is_none());
        // IHL < 5, wrong version, total length < header.
        let mut g = f.clone();
        g[14] = 0x44;
        assert!(parse(&g).l3.is_none());
        g[14] = 0x55;
        assert!(parse(&g).l3.is_none());
        let mut g = f.clone();
        g[16..18].copy_from_slice(&10u16.to_be_bytes());
        assert!(parse(&g).l3.is_none());
        // Total length longer than the frame: clamped.
        let mut g = f.clone();
        g[16..18].copy_from_slice(&9000u16.to_be_bytes());
        assert_eq!(parse(&g).l3_end, f.len());
        // Short frames.
        assert_eq!(parse(&f[..13]), ParsedFrame::default());
        assert!(parse(&f[..14]).l3.is_none());
    }

    #[test]
    fn double_vlan_stops_at_l2() {
        let mut f = tcp4();
        // Insert two tags.
        f.splice(12..12, [0x88, 0xa8, 0, 1, 0x81, 0x00, 0, 2]);
        let p = parse(&f);
        let l2 = p.l2.unwrap();
        assert_eq!(l2.vlan.unwrap().vid(), 1);
        assert_eq!(l2.ethertype, ETHERTYPE_VLAN);
        assert!(p.l3.is_none());
    }

    #[test]
    fn ipv6_extension_headers() {
        let home: Ipv6Addr = "2001:db8::aa".parse().unwrap();
        let care: Ipv6Addr = "2001:db8::bb".parse().unwrap();
        let mut b = FrameBuilder::udp(
            "2001:db8::1".parse().unwrap(),
            1,
            "2001:db8::2".parse().unwrap(),
            2,
        );
        b.ipv6_ext = vec![
            Ipv6Ext::HopByHop,
            Ipv6Ext::Routing2(care),
            Ipv6Ext::HomeAddress(home),
        ];
        let f = b.build(b"xyz");
        let p = parse(&f);
        let Some(L3::V6(ip)) = p.l3 else {
            panic!("no v6")
        };
        assert!(ip.has_ext_headers && !ip.fragment && !ip.ext_truncated);
        assert_eq!((ip.home_address, ip.rt2_address), (Some(home), Some(care)));
        assert_eq!(
            (ip.protocol, ip.header_len),
            (IPPROTO_UDP, 40 + 8 + 24 + 24)
        );
        assert_eq!(p.l4.unwrap().dst_port, 2);
        // Truncating inside the chain drops L4 and flags it.
        let p = parse(&f[..14 + 40 + 8 + 10]);
        let Some(L3::V6(ip)) = p.l3 else {
            panic!("no v6")
        };
        assert!(ip.ext_truncated && p.l4.is_none());
        // A chain of 17 Hop-by-Hop-shaped headers is too long.
        b.ipv6_ext = vec![Ipv6Ext::HopByHop; 17];
        let p = parse(&b.build(b""));
        let Some(L3::V6(ip)) = p.l3 else {
            panic!("no v6")
        };
        assert!(ip.ext_truncated && p.l4.is_none());
        // Atomic fragment (offset 0, M clear) still exposes L4.
        b.ipv6_ext = vec![Ipv6Ext::Fragment {
            offset: 0,
            more: false,
        }];
        assert!(parse(&b.build(b"")).l4.is_some());
        b.ipv6_ext = vec![Ipv6Ext::Fragment {
            offset: 1,
            more: false,
        }];
        let p = parse(&b.build(b""));
        assert!(p.l3.unwrap().is_fragment() && p.l4.is_none());
    }

    #[test]
    fn home_address_option_scan() {
        let a: Ipv6Addr = "::1".parse().unwrap();
        let mut opts = vec![0, 1, 2, 0, 0, 201, 16];
        opts.extend_from_slice(&a.octets());
        assert_eq!(find_home_address(&opts), Some(a));
        // Wrong length, truncated option, no option.
        assert_eq!(find_home_address(&[201, 4, 0, 0, 0, 0]), None);
        assert_eq!(find_home_address(&[201, 16, 0]), None);
        assert_eq!(find_home_address(&[0, 0, 1, 0]), None);
    }

    fn rocev2_frame(vlan: Option<u16>) -> Vec<u8> {
        let mut b = FrameBuilder::udp(
            "192.168.7.1".parse().unwrap(),
            49152,
            "192.168.7.2".parse().unwrap(),
            ROCEV2_PORT,
        );
        b.vlan_tci = vlan;
        // BTH: RC SEND ONLY (4), dest QP 0x123456, PSN 0xabcdef; then a
        // 4-byte payload and the ICRC.
        let mut bth = vec![
            4, 0, 0xff, 0xff, 0, 0x12, 0x34, 0x56, 0x80, 0xab, 0xcd, 0xef,
        ];
        bth.extend_from_slice(&[1, 2, 3, 4, 9, 9, 9, 9]);
        b.build(&bth)
    }

    #[test]
    fn rocev2_bth_fields() {
        for vlan in [None, Some(7)] {
            let f = rocev2_frame(vlan);
            let p = parse(&f);
            assert!(p.is_rocev2());
            assert_eq!(
                p.bth,
                Some(RoceBth {
                    opcode: 4,
                    dest_qp: 0x12_3456,
                    psn: 0xab_cdef
                })
            );
            assert_eq!(p.vlan().map(|v| v.vid()), vlan);
            assert_eq!(p.ports(), Some((49152, ROCEV2_PORT)));
            assert_eq!(p.ip_protocol(), Some(IPPROTO_UDP));
            assert_eq!(p.src_ip(), Some("192.168.7.1".parse().unwrap()));
            assert_eq!(p.dst_ip(), Some("192.168.7.2".parse().unwrap()));
            assert_eq!(p.ethertype(), Some(ETHERTYPE_IPV4));
            // A UDP header without a whole BTH behind it: RoCEv2, no BTH.
            let short = p.l4_offset + 8 + BTH_LEN - 1;
            let q = parse(&f[..short]);
            assert!(q.is_rocev2() && q.bth.is_none());
        }
        // Another UDP port: no BTH even with the bytes there.
        let mut f = rocev2_frame(None);
        f[36..38].copy_from_slice(&4792u16.to_be_bytes());
        let p = parse(&f);
        assert!(!p.is_rocev2() && p.bth.is_none());
    }

    /// The view's offsets never point outside the frame, and each layer
    /// needs the one below it.
    fn check_invariants(f: &[u8], p: &ParsedFrame) {
        if p.l2.is_none() {
            assert_eq!(*p, ParsedFrame::default());
            return;
        }
        if let Some(l3) = p.l3 {
            assert!(p.l3_offset + l3.header_len() <= f.len());
            assert!(p.l3_end <= f.len() && p.l3_offset <= p.l3_end);
        } else {
            assert!(p.l4.is_none());
        }
        if let Some(l4) = p.l4 {
            assert!(p.l4_offset + l4.header_len <= p.l3_end);
            assert!(p.l4_payload_len().is_some());
        } else {
            assert!(p.bth.is_none());
        }
        if p.bth.is_some() {
            assert!(p.is_rocev2() && p.l4_offset + 8 + BTH_LEN <= f.len());
        }
    }

    /// Exhaustive without a fuzzer: every prefix of real frames, every
    /// single-byte value at every header position, and random bytes.
    #[test]
    fn never_panics_on_prefixes_mutations_or_noise() {
        let mut v6 = FrameBuilder::tcp(
            "2001:db8::1".parse().unwrap(),
            1,
            "2001:db8::2".parse().unwrap(),
            2,
        );
        v6.ipv6_ext = vec![
            Ipv6Ext::HopByHop,
            Ipv6Ext::Routing2("2001:db8::bb".parse().unwrap()),
            Ipv6Ext::HomeAddress("2001:db8::aa".parse().unwrap()),
        ];
        let mut frag = FrameBuilder::udp(
            "10.0.0.1".parse().unwrap(),
            1,
            "10.0.0.2".parse().unwrap(),
            2,
        );
        frag.ipv4_fragment = (0, true);
        frag.ipv4_options = vec![1, 1, 1, 1];
        let frames = [
            tcp4(),
            rocev2_frame(None),
            rocev2_frame(Some(3)),
            v6.build(b"payload"),
            frag.build(b"x"),
        ];
        for f in &frames {
            for n in 0..=f.len() {
                check_invariants(&f[..n], &parse(&f[..n]));
            }
            // Every value of every header byte (the payload is not parsed).
            let hdr = f.len().min(14 + 4 + 40 + 8 + 24 + 24 + 20 + 12);
            let mut g = f.clone();
            for at in 0..hdr {
                let keep = g[at];
                for x in 0..=255u8 {
                    g[at] = x;
                    check_invariants(&g, &parse(&g));
                }
                g[at] = keep;
            }
        }
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _ in 0..20_000 {
            let len = (next() % 200) as usize;
            let mut f: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Bias towards frames that reach the upper layers.
            match next() % 4 {
                0 if len >= 14 => f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes()),
                1 if len >= 14 => f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes()),
                2 if len >= 18 => {
                    f[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
                    f[16..18].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
                }
                _ => {}
            }
            check_invariants(&f, &parse(&f));
        }
    }
}
