//! A small frame builder for tests and examples (Ethernet, one VLAN tag,
//! IPv4 with options/fragment fields, IPv6 with extension headers, TCP, UDP).
//!
//! Checksums: the IPv4 header checksum is computed; TCP/UDP checksums are left
//! zero (the receive model does not verify them); fill them with
//! [`checksum::fill_l4`] where they matter.

use std::net::{IpAddr, Ipv6Addr};

use crate::checksum;
use crate::ethernet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_VLAN};
use crate::ip::{IPPROTO_TCP, IPPROTO_UDP};

/// The transport header to emit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// TCP with `options` bytes of TCP options (padded to a multiple of 4).
    Tcp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
        /// Option bytes (NOPs are fine); padded with zeros to 4-byte words.
        options: Vec<u8>,
    },
    /// UDP.
    Udp {
        /// Source port.
        src_port: u16,
        /// Destination port.
        dst_port: u16,
    },
    /// Any other protocol number; the payload follows the IP header(s).
    Other(u8),
}

/// An IPv6 extension header to insert between the fixed header and L4.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ipv6Ext {
    /// An 8-byte Hop-by-Hop options header holding one PadN option.
    HopByHop,
    /// Destination Options carrying a Home Address option.
    HomeAddress(Ipv6Addr),
    /// Type 2 Routing header carrying one address.
    Routing2(Ipv6Addr),
    /// Fragment header with the given offset (in 8-byte units) and M flag.
    Fragment {
        /// Fragment offset in 8-byte units.
        offset: u16,
        /// More-fragments flag.
        more: bool,
    },
}

/// Builds a frame; see the field docs for defaults.
#[derive(Debug, Clone)]
pub struct FrameBuilder {
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Optional 802.1Q tag control information.
    pub vlan_tci: Option<u16>,
    /// Source and destination IP (both of one family).
    pub src_ip: IpAddr,
    /// Destination IP.
    pub dst_ip: IpAddr,
    /// IPv4 options (padded to 4-byte words). Ignored for IPv6.
    pub ipv4_options: Vec<u8>,
    /// IPv4 fragment offset (8-byte units) and MF flag.
    pub ipv4_fragment: (u16, bool),
    /// IPv6 extension headers, in order.
    pub ipv6_ext: Vec<Ipv6Ext>,
    /// Transport header.
    pub transport: Transport,
}

impl FrameBuilder {
    /// A TCP segment between two addresses (of the same family).
    pub fn tcp(src: IpAddr, src_port: u16, dst: IpAddr, dst_port: u16) -> Self {
        Self::new(
            src,
            dst,
            Transport::Tcp {
                src_port,
                dst_port,
                options: Vec::new(),
            },
        )
    }

    /// A UDP datagram between two addresses (of the same family).
    pub fn udp(src: IpAddr, src_port: u16, dst: IpAddr, dst_port: u16) -> Self {
        Self::new(src, dst, Transport::Udp { src_port, dst_port })
    }

    /// A frame with the given addresses and transport.
    pub fn new(src_ip: IpAddr, dst_ip: IpAddr, transport: Transport) -> Self {
        FrameBuilder {
            dst_mac: [0x52, 0x54, 0, 0, 0, 0x0a],
            src_mac: [0x52, 0x54, 0, 0, 0, 0x0b],
            vlan_tci: None,
            src_ip,
            dst_ip,
            ipv4_options: Vec::new(),
            ipv4_fragment: (0, false),
            ipv6_ext: Vec::new(),
            transport,
        }
    }

    /// Builds the frame carrying `payload` (no Ethernet padding is added).
    pub fn build(&self, payload: &[u8]) -> Vec<u8> {
        let mut l4 = Vec::new();
        let proto = match &self.transport {
            Transport::Tcp {
                src_port,
                dst_port,
                options,
            } => {
                let mut opts = options.clone();
                opts.resize(opts.len().div_ceil(4) * 4, 0);
                let doff = (20 + opts.len()) / 4;
                l4.extend_from_slice(&src_port.to_be_bytes());
                l4.extend_from_slice(&dst_port.to_be_bytes());
                l4.extend_from_slice(&1u32.to_be_bytes()); // seq
                l4.extend_from_slice(&0u32.to_be_bytes()); // ack
                l4.push((doff as u8) << 4);
                l4.push(0x18); // PSH|ACK
                l4.extend_from_slice(&65535u16.to_be_bytes());
                l4.extend_from_slice(&[0, 0, 0, 0]); // csum, urg
                l4.extend_from_slice(&opts);
                IPPROTO_TCP
            }
            Transport::Udp { src_port, dst_port } => {
                l4.extend_from_slice(&src_port.to_be_bytes());
                l4.extend_from_slice(&dst_port.to_be_bytes());
                let len = (8 + payload.len()).min(65535) as u16;
                l4.extend_from_slice(&len.to_be_bytes());
                l4.extend_from_slice(&[0, 0]);
                IPPROTO_UDP
            }
            Transport::Other(p) => *p,
        };
        l4.extend_from_slice(payload);

        let mut f = Vec::with_capacity(l4.len() + 100);
        f.extend_from_slice(&self.dst_mac);
        f.extend_from_slice(&self.src_mac);
        if let Some(tci) = self.vlan_tci {
            f.extend_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
            f.extend_from_slice(&tci.to_be_bytes());
        }
        match (self.src_ip, self.dst_ip) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
                let mut opts = self.ipv4_options.clone();
                opts.resize(opts.len().div_ceil(4) * 4, 0);
                let hl = 20 + opts.len();
                let total = (hl + l4.len()).min(65535) as u16;
                let (fo, mf) = self.ipv4_fragment;
                let frag = (fo & 0x1fff) | if mf { 0x2000 } else { 0 };
                let mut h = vec![0x40 | (hl / 4) as u8, 0];
                h.extend_from_slice(&total.to_be_bytes());
                h.extend_from_slice(&[0x12, 0x34]);
                h.extend_from_slice(&frag.to_be_bytes());
                h.extend_from_slice(&[64, proto, 0, 0]);
                h.extend_from_slice(&s.octets());
                h.extend_from_slice(&d.octets());
                h.extend_from_slice(&opts);
                checksum::fill_ipv4_header(&mut h);
                f.extend_from_slice(&h);
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                f.extend_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
                let mut ext = Vec::new();
                let mut kinds = Vec::new();
                for (i, e) in self.ipv6_ext.iter().enumerate() {
                    let next = self.ipv6_ext.get(i + 1).map(ext_kind).unwrap_or(proto);
                    kinds.push(ext_kind(e));
                    ext.extend_from_slice(&ext_bytes(e, next));
                }
                let first = kinds.first().copied().unwrap_or(proto);
                let plen = (ext.len() + l4.len()).min(65535) as u16;
                f.extend_from_slice(&[0x60, 0, 0, 0]);
                f.extend_from_slice(&plen.to_be_bytes());
                f.extend_from_slice(&[first, 64]);
                f.extend_from_slice(&s.octets());
                f.extend_from_slice(&d.octets());
                f.extend_from_slice(&ext);
            }
            _ => panic!("FrameBuilder: source and destination IP families differ"),
        }
        f.extend_from_slice(&l4);
        f
    }
}

fn ext_kind(e: &Ipv6Ext) -> u8 {
    match e {
        Ipv6Ext::HopByHop => 0,
        Ipv6Ext::HomeAddress(_) => 60,
        Ipv6Ext::Routing2(_) => 43,
        Ipv6Ext::Fragment { .. } => 44,
    }
}

fn ext_bytes(e: &Ipv6Ext, next: u8) -> Vec<u8> {
    match e {
        // 8 bytes: next, len 0, PadN(4 bytes body).
        Ipv6Ext::HopByHop => vec![next, 0, 1, 4, 0, 0, 0, 0],
        // 24 bytes: next, len 2, Pad1, Pad1, HAO (type 201, len 16, address:
        // 8n+6 aligned as RFC 6275 asks), PadN with an empty body.
        Ipv6Ext::HomeAddress(a) => {
            let mut v = vec![next, 2, 0, 0, 201, 16];
            v.extend_from_slice(&a.octets());
            v.extend_from_slice(&[1, 0]); // PadN with empty body
            v
        }
        Ipv6Ext::Routing2(a) => {
            let mut v = vec![next, 2, 2, 1, 0, 0, 0, 0];
            v.extend_from_slice(&a.octets());
            v
        }
        Ipv6Ext::Fragment { offset, more } => {
            let fo = (offset << 3) | u16::from(*more);
            let mut v = vec![next, 0];
            v.extend_from_slice(&fo.to_be_bytes());
            v.extend_from_slice(&[0, 0, 0, 1]);
            v
        }
    }
}
