//! Just enough Ethernet / IP / TCP to find RoCEv2 and candidate TCP
//! payloads cheaply (the header types come from `roce-model`).

use roce_model::wire::{EthernetHeader, Ipv4Header, Ipv6Header};
use serde::{Deserialize, Serialize};
use std::fmt;
use wire::ethernet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use wire::ip::IPPROTO_UDP;
use wire::roce::ROCEV2_PORT;

/// A node address: IPv4, IPv6, or an InfiniBand LID (native IB captures).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Addr {
    /// IPv4.
    V4([u8; 4]),
    /// IPv6.
    V6([u8; 16]),
    /// IB local identifier.
    Lid(u16),
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::V4(a) => write!(f, "{}", std::net::Ipv4Addr::from(*a)),
            Addr::V6(a) => write!(f, "{}", std::net::Ipv6Addr::from(*a)),
            Addr::Lid(l) => write!(f, "lid{l:#06x}"),
        }
    }
}

/// What a frame may be to the checker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interest {
    /// Not RoCE and not TCP.
    None,
    /// RoCEv2 (IPv4/IPv6, UDP destination port 4791) or RoCEv1.
    Roce,
    /// TCP whose payload starts with an MPA Request/Reply key or an SMC CLC
    /// eyecatcher: may start a session the checker follows.
    TcpSessionStart,
    /// Any other TCP segment (only interesting for followed connections).
    Tcp,
}

/// The MPA Request and Reply keys share this prefix.
const MPA_KEY_PREFIX: &[u8] = b"MPA ID Re";
/// SMC-R and SMC-D CLC eyecatchers (EBCDIC "SMCR" / "SMCD").
pub(crate) const EYECATCHER_SMCR: [u8; 4] = [0xe2, 0xd4, 0xc3, 0xd9];
/// SMC-D eyecatcher.
pub(crate) const EYECATCHER_SMCD: [u8; 4] = [0xe2, 0xd4, 0xc3, 0xc4];

struct L3<'a> {
    src: Addr,
    dst: Addr,
    proto: u8,
    /// The L4 header and payload, cut to the IP length.
    l4: &'a [u8],
}

fn l3(frame: &[u8]) -> Option<L3<'_>> {
    let (eth, off) = EthernetHeader::parse(frame).ok()?;
    let rest = frame.get(off..)?;
    match eth.ethertype {
        ETHERTYPE_IPV4 => {
            let (ip, ihl) = Ipv4Header::parse(rest).ok()?;
            if ip.flags_frag & 0x3fff != 0 {
                return None;
            }
            let total = usize::from(ip.total_len);
            // A guest using TSO may leave total_len 0 on a super-frame.
            let end = if total == 0 { rest.len() } else { total };
            Some(L3 {
                src: Addr::V4(ip.src),
                dst: Addr::V4(ip.dst),
                proto: ip.protocol,
                l4: rest.get(ihl..end.min(rest.len()))?,
            })
        }
        ETHERTYPE_IPV6 => {
            let ip = Ipv6Header::parse(rest).ok()?;
            let pl = usize::from(ip.payload_len);
            let end = if pl == 0 {
                rest.len()
            } else {
                (Ipv6Header::LEN + pl).min(rest.len())
            };
            Some(L3 {
                src: Addr::V6(ip.src),
                dst: Addr::V6(ip.dst),
                proto: ip.next_header,
                l4: rest.get(Ipv6Header::LEN..end)?,
            })
        }
        _ => None,
    }
}

/// Classifies a frame with a handful of byte reads.
pub fn classify(frame: &[u8]) -> Interest {
    // RoCEv1 (Ethertype 0x8915, untagged): fed by captures, not by rxe.
    if frame.get(12..14) == Some(&[0x89, 0x15]) {
        return Interest::Roce;
    }
    let Some(l) = l3(frame) else {
        return Interest::None;
    };
    match l.proto {
        17 => match l.l4.get(2..4) {
            Some(p) if u16::from_be_bytes([p[0], p[1]]) == ROCEV2_PORT => Interest::Roce,
            _ => Interest::None,
        },
        6 => {
            let Some(doff) = l.l4.get(12).map(|b| usize::from(b >> 4) * 4) else {
                return Interest::None;
            };
            match l.l4.get(doff..) {
                Some(p) if p.starts_with(MPA_KEY_PREFIX) => Interest::TcpSessionStart,
                Some(p) if p.starts_with(&EYECATCHER_SMCR) || p.starts_with(&EYECATCHER_SMCD) => {
                    Interest::TcpSessionStart
                }
                _ => Interest::Tcp,
            }
        }
        _ => Interest::None,
    }
}

/// A parsed TCP segment.
#[derive(Debug, Clone, Copy)]
pub struct TcpSegment<'a> {
    /// Source address.
    pub src: Addr,
    /// Destination address.
    pub dst: Addr,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// Sequence number.
    pub seq: u32,
    /// SYN flag.
    pub syn: bool,
    /// FIN or RST flag.
    pub fin_or_rst: bool,
    /// Payload.
    pub payload: &'a [u8],
}

impl<'a> TcpSegment<'a> {
    /// Parses Ethernet / IP / TCP; `None` if the frame is not TCP.
    pub fn parse(frame: &'a [u8]) -> Option<TcpSegment<'a>> {
        let l = l3(frame)?;
        if l.proto != 6 {
            return None;
        }
        let t = l.l4;
        let h = t.get(..20)?;
        let doff = usize::from(h[12] >> 4) * 4;
        if doff < 20 {
            return None;
        }
        let flags = h[13];
        Some(TcpSegment {
            src: l.src,
            dst: l.dst,
            sport: u16::from_be_bytes([h[0], h[1]]),
            dport: u16::from_be_bytes([h[2], h[3]]),
            seq: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
            syn: flags & 0x02 != 0,
            fin_or_rst: flags & 0x05 != 0,
            payload: t.get(doff..)?,
        })
    }
}

/// Source, destination and UDP payload (BTH onwards) of a RoCEv2 frame,
/// without validating anything past the UDP destination port.
pub(crate) fn roce_parts(frame: &[u8]) -> Option<(Addr, Addr, &[u8])> {
    let l = l3(frame)?;
    if l.proto != IPPROTO_UDP || l.l4.get(2..4)? != ROCEV2_PORT.to_be_bytes() {
        return None;
    }
    Some((l.src, l.dst, l.l4.get(8..)?))
}
