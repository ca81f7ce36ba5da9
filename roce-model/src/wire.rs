//! Minimal Ethernet / IPv4 / IPv6 / UDP / GRH / LRH headers: just enough to
//! carry RoCE. No options are emitted; IPv4 options are skipped on parse.
//! The constants (ethertypes, the RoCEv2 port, protocol numbers) and the
//! Internet checksum are the `wire` crate's.

use crate::error::{need, need_mut, CodecError, Result};
use ::wire::checksum::{checksum, verify};
use ::wire::ethernet::ETHERTYPE_VLAN;

/// GRH next-header value announcing a BTH.
pub const GRH_NEXT_HEADER_BTH: u8 = 0x1b;

/// Ethernet II header with an optional single 802.1Q tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetHeader {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// VLAN TCI (PCP/DEI/VID) if tagged.
    pub vlan_tci: Option<u16>,
    /// Ethertype of the payload.
    pub ethertype: u16,
}

impl EthernetHeader {
    /// Header length on the wire (14 or 18).
    pub fn len(&self) -> usize {
        if self.vlan_tci.is_some() {
            18
        } else {
            14
        }
    }
    /// Always false (a header is never empty); for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        false
    }
    /// Parse; returns the header and its length.
    pub fn parse(buf: &[u8]) -> Result<(Self, usize)> {
        let b = need(buf, 14, "Ethernet")?;
        let mut dst = [0; 6];
        let mut src = [0; 6];
        dst.copy_from_slice(&b[0..6]);
        src.copy_from_slice(&b[6..12]);
        let et = u16::from_be_bytes([b[12], b[13]]);
        if et == ETHERTYPE_VLAN {
            let b = need(buf, 18, "802.1Q")?;
            let h = EthernetHeader {
                dst,
                src,
                vlan_tci: Some(u16::from_be_bytes([b[14], b[15]])),
                ethertype: u16::from_be_bytes([b[16], b[17]]),
            };
            return Ok((h, 18));
        }
        Ok((
            EthernetHeader {
                dst,
                src,
                vlan_tci: None,
                ethertype: et,
            },
            14,
        ))
    }
    /// Append to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        let mut b = [0u8; 18];
        let n = self.write(&mut b);
        out.extend_from_slice(&b[..n]);
    }
    /// Write at the start of `out` (at least [`EthernetHeader::len`] bytes);
    /// returns the length written.
    pub fn write(&self, out: &mut [u8]) -> usize {
        out[0..6].copy_from_slice(&self.dst);
        out[6..12].copy_from_slice(&self.src);
        let mut at = 12;
        if let Some(tci) = self.vlan_tci {
            out[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
            out[14..16].copy_from_slice(&tci.to_be_bytes());
            at = 16;
        }
        out[at..at + 2].copy_from_slice(&self.ethertype.to_be_bytes());
        at + 2
    }
}

/// IPv4 header (options are skipped on parse and never emitted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Header {
    /// DSCP (6 bits) and ECN (2 bits).
    pub tos: u8,
    /// Total length (header + payload).
    pub total_len: u16,
    /// Identification.
    pub ident: u16,
    /// Flags (3 bits) and fragment offset.
    pub flags_frag: u16,
    /// Time to live.
    pub ttl: u8,
    /// Protocol.
    pub protocol: u8,
    /// Header checksum as found / emitted.
    pub checksum: u16,
    /// Source address.
    pub src: [u8; 4],
    /// Destination address.
    pub dst: [u8; 4],
}

impl Ipv4Header {
    /// Don't-fragment flag in `flags_frag`.
    pub const DF: u16 = 0x4000;

    /// Parse; returns the header and its length (IHL × 4).
    pub fn parse(buf: &[u8]) -> Result<(Self, usize)> {
        let b = need(buf, 20, "IPv4")?;
        let ihl = usize::from(b[0] & 0xf) * 4;
        if b[0] >> 4 != 4 || ihl < 20 {
            return Err(CodecError::BadHeader("IPv4"));
        }
        need(buf, ihl, "IPv4 options")?;
        let be = |o: usize| u16::from_be_bytes([b[o], b[o + 1]]);
        Ok((
            Ipv4Header {
                tos: b[1],
                total_len: be(2),
                ident: be(4),
                flags_frag: be(6),
                ttl: b[8],
                protocol: b[9],
                checksum: be(10),
                src: [b[12], b[13], b[14], b[15]],
                dst: [b[16], b[17], b[18], b[19]],
            },
            ihl,
        ))
    }

    /// Emit a 20-byte header with a freshly computed checksum (the `checksum` field is ignored).
    pub fn emit(&self) -> [u8; 20] {
        let mut b = [0u8; 20];
        b[0] = 0x45;
        b[1] = self.tos;
        b[2..4].copy_from_slice(&self.total_len.to_be_bytes());
        b[4..6].copy_from_slice(&self.ident.to_be_bytes());
        b[6..8].copy_from_slice(&self.flags_frag.to_be_bytes());
        b[8] = self.ttl;
        b[9] = self.protocol;
        b[12..16].copy_from_slice(&self.src);
        b[16..20].copy_from_slice(&self.dst);
        let c = checksum(&b);
        b[10..12].copy_from_slice(&c.to_be_bytes());
        b
    }

    /// Does `hdr` (the raw header incl. options) carry a correct checksum?
    pub fn checksum_ok(hdr: &[u8]) -> bool {
        verify(hdr, 0)
    }
}

/// IPv6 fixed header; also the layout of the InfiniBand GRH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Header {
    /// Version nibble (6 for IPv6 and for a GRH).
    pub version: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label, 20 bits.
    pub flow_label: u32,
    /// Payload length.
    pub payload_len: u16,
    /// Next header (17 = UDP; 0x1B = BTH in a GRH).
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source address / SGID.
    pub src: [u8; 16],
    /// Destination address / DGID.
    pub dst: [u8; 16],
}

/// The InfiniBand Global Route Header has the IPv6 layout.
pub type Grh = Ipv6Header;

impl Ipv6Header {
    /// Header length.
    pub const LEN: usize = 40;

    /// Parse the 40-byte fixed header.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let b = need(buf, Self::LEN, "IPv6/GRH")?;
        let w = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let mut src = [0; 16];
        let mut dst = [0; 16];
        src.copy_from_slice(&b[8..24]);
        dst.copy_from_slice(&b[24..40]);
        Ok(Ipv6Header {
            version: (w >> 28) as u8,
            traffic_class: (w >> 20) as u8,
            flow_label: w & 0xf_ffff,
            payload_len: u16::from_be_bytes([b[4], b[5]]),
            next_header: b[6],
            hop_limit: b[7],
            src,
            dst,
        })
    }

    /// Emit 40 bytes (flow label masked to 20 bits, version to 4).
    pub fn emit(&self) -> [u8; 40] {
        let mut b = [0u8; 40];
        let w = (u32::from(self.version & 0xf) << 28)
            | (u32::from(self.traffic_class) << 20)
            | (self.flow_label & 0xf_ffff);
        b[0..4].copy_from_slice(&w.to_be_bytes());
        b[4..6].copy_from_slice(&self.payload_len.to_be_bytes());
        b[6] = self.next_header;
        b[7] = self.hop_limit;
        b[8..24].copy_from_slice(&self.src);
        b[24..40].copy_from_slice(&self.dst);
        b
    }
}

/// UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpHeader {
    /// Source port (flow entropy for RoCEv2).
    pub src_port: u16,
    /// Destination port (4791 for RoCEv2).
    pub dst_port: u16,
    /// Length of header + payload.
    pub len: u16,
    /// Checksum (0 = none, IPv4 only).
    pub checksum: u16,
}

impl UdpHeader {
    /// Header length.
    pub const LEN: usize = 8;

    /// Parse 8 bytes.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let b = need(buf, Self::LEN, "UDP")?;
        let be = |o: usize| u16::from_be_bytes([b[o], b[o + 1]]);
        Ok(UdpHeader {
            src_port: be(0),
            dst_port: be(2),
            len: be(4),
            checksum: be(6),
        })
    }
    /// Emit 8 bytes.
    pub fn emit(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0..2].copy_from_slice(&self.src_port.to_be_bytes());
        b[2..4].copy_from_slice(&self.dst_port.to_be_bytes());
        b[4..6].copy_from_slice(&self.len.to_be_bytes());
        b[6..8].copy_from_slice(&self.checksum.to_be_bytes());
        b
    }
}

/// InfiniBand Local Route Header, 8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lrh {
    /// Virtual lane (15 = management).
    pub vl: u8,
    /// Link version.
    pub lver: u8,
    /// Service level.
    pub sl: u8,
    /// Link next header: 0 raw, 1 IP, 2 IBA local (BTH), 3 IBA global (GRH).
    pub lnh: u8,
    /// Destination LID.
    pub dlid: u16,
    /// Packet length in 4-byte words, LRH through ICRC (VCRC excluded).
    pub pkt_len: u16,
    /// Source LID.
    pub slid: u16,
}

impl Lrh {
    /// Header length.
    pub const LEN: usize = 8;
    /// LNH value: BTH follows.
    pub const LNH_IBA_LOCAL: u8 = 2;
    /// LNH value: GRH then BTH follow.
    pub const LNH_IBA_GLOBAL: u8 = 3;

    /// Parse 8 bytes.
    pub fn parse(buf: &[u8]) -> Result<Self> {
        let b = need(buf, Self::LEN, "LRH")?;
        Ok(Lrh {
            vl: b[0] >> 4,
            lver: b[0] & 0xf,
            sl: b[1] >> 4,
            lnh: b[1] & 3,
            dlid: u16::from_be_bytes([b[2], b[3]]),
            pkt_len: u16::from_be_bytes([b[4], b[5]]) & 0x7ff,
            slid: u16::from_be_bytes([b[6], b[7]]),
        })
    }

    /// Emit into the first 8 bytes of `buf`.
    pub fn write(&self, buf: &mut [u8]) -> Result<()> {
        let b = need_mut(buf, Self::LEN)?;
        b[0] = (self.vl << 4) | (self.lver & 0xf);
        b[1] = (self.sl << 4) | (self.lnh & 3);
        b[2..4].copy_from_slice(&self.dlid.to_be_bytes());
        b[4..6].copy_from_slice(&(self.pkt_len & 0x7ff).to_be_bytes());
        b[6..8].copy_from_slice(&self.slid.to_be_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::wire::ip::IPPROTO_UDP;

    #[test]
    fn ipv4_checksum_roundtrip() {
        let h = Ipv4Header {
            tos: 0,
            total_len: 60,
            ident: 0x1234,
            flags_frag: Ipv4Header::DF,
            ttl: 64,
            protocol: IPPROTO_UDP,
            checksum: 0,
            src: [10, 0, 0, 1],
            dst: [10, 0, 0, 2],
        };
        let b = h.emit();
        assert!(Ipv4Header::checksum_ok(&b));
        let (p, n) = Ipv4Header::parse(&b).unwrap();
        assert_eq!(n, 20);
        assert_eq!(p.checksum, u16::from_be_bytes([b[10], b[11]]));
    }

    #[test]
    fn ipv6_roundtrip() {
        let h = Ipv6Header {
            version: 6,
            traffic_class: 0xab,
            flow_label: 0x12345,
            payload_len: 100,
            next_header: IPPROTO_UDP,
            hop_limit: 64,
            src: [1; 16],
            dst: [2; 16],
        };
        assert_eq!(Ipv6Header::parse(&h.emit()).unwrap(), h);
    }
}
