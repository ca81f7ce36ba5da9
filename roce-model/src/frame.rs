//! Complete frames: Ethernet + (IPv4 | IPv6) + UDP 4791 + BTH..ICRC (RoCEv2),
//! Ethernet 0x8915 + GRH + BTH..ICRC (RoCEv1), and native InfiniBand
//! LRH [+ GRH] + BTH..ICRC [+ VCRC].

use crate::error::{CodecError, Result};
use crate::icrc::{IcrcScope, ICRC_LEN};
use crate::packet::{PacketBuilder, RocePacket};
use crate::wire::{
    EthernetHeader, Grh, Ipv4Header, Ipv6Header, Lrh, UdpHeader, GRH_NEXT_HEADER_BTH,
};
use ::wire::checksum::{finish_udp, ones_sum, pseudo_v6};
use ::wire::ethernet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_ROCE_V1, ETHERTYPE_VLAN};
use ::wire::ip::IPPROTO_UDP;
use ::wire::roce::ROCEV2_PORT;

/// The network layer below the BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetLayer<'a> {
    /// RoCEv2 over IPv4.
    Ipv4 {
        /// Parsed IPv4 header.
        ip: Ipv4Header,
        /// Parsed UDP header.
        udp: UdpHeader,
        /// Raw IPv4 header bytes (with options).
        ip_raw: &'a [u8],
        /// Raw UDP header bytes.
        udp_raw: &'a [u8],
    },
    /// RoCEv2 over IPv6.
    Ipv6 {
        /// Parsed IPv6 header.
        ip: Ipv6Header,
        /// Parsed UDP header.
        udp: UdpHeader,
        /// Raw IPv6 header bytes.
        ip_raw: &'a [u8],
        /// Raw UDP header bytes.
        udp_raw: &'a [u8],
    },
    /// RoCEv1: GRH directly after Ethernet.
    Grh {
        /// Parsed GRH.
        grh: Grh,
        /// Raw GRH bytes.
        grh_raw: &'a [u8],
    },
}

impl<'a> NetLayer<'a> {
    /// ICRC scope for this network layer.
    pub fn icrc_scope(&self) -> IcrcScope<'a> {
        match *self {
            NetLayer::Ipv4 {
                ip_raw, udp_raw, ..
            } => IcrcScope::Ipv4 {
                ip: ip_raw,
                udp: udp_raw,
            },
            NetLayer::Ipv6 {
                ip_raw, udp_raw, ..
            } => IcrcScope::Ipv6 {
                ip: ip_raw,
                udp: udp_raw,
            },
            NetLayer::Grh { grh_raw, .. } => IcrcScope::Grh(grh_raw),
        }
    }
}

/// A parsed RoCE (v1 or v2) Ethernet frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceFrame<'a> {
    /// Ethernet header.
    pub eth: EthernetHeader,
    /// IP/UDP or GRH.
    pub net: NetLayer<'a>,
    /// Transport packet.
    pub packet: RocePacket<'a>,
}

impl<'a> RoceFrame<'a> {
    /// Parse an Ethernet frame (no FCS). Trailing Ethernet padding beyond the
    /// IP / GRH length is ignored. RoCEv2 requires UDP destination port 4791.
    /// The ICRC is not checked here: see [`RoceFrame::verify_icrc`].
    pub fn parse(frame: &'a [u8]) -> Result<RoceFrame<'a>> {
        let (eth, off) = EthernetHeader::parse(frame)?;
        let rest = &frame[off..];
        let (net, bth_on) = match eth.ethertype {
            ETHERTYPE_IPV4 => {
                let (ip, ihl) = Ipv4Header::parse(rest)?;
                if ip.protocol != IPPROTO_UDP {
                    return Err(CodecError::NotRoce("IP protocol is not UDP"));
                }
                if ip.flags_frag & 0x3fff != 0 {
                    return Err(CodecError::NotRoce("fragmented IPv4"));
                }
                let total = usize::from(ip.total_len);
                if total < ihl || total > rest.len() {
                    return Err(CodecError::LengthMismatch {
                        what: "IPv4 total",
                        declared: total,
                        actual: rest.len(),
                    });
                }
                let (ip_raw, l4) = rest[..total].split_at(ihl);
                let (udp, udp_raw, bth_on) = parse_udp(l4)?;
                (
                    NetLayer::Ipv4 {
                        ip,
                        udp,
                        ip_raw,
                        udp_raw,
                    },
                    bth_on,
                )
            }
            ETHERTYPE_IPV6 => {
                let ip = Ipv6Header::parse(rest)?;
                if ip.next_header != IPPROTO_UDP {
                    return Err(CodecError::NotRoce("IPv6 next header is not UDP"));
                }
                let (ip_raw, l4) = rest.split_at(Ipv6Header::LEN);
                let pl = usize::from(ip.payload_len);
                let l4 = l4.get(..pl).ok_or(CodecError::LengthMismatch {
                    what: "IPv6 payload",
                    declared: pl,
                    actual: l4.len(),
                })?;
                let (udp, udp_raw, bth_on) = parse_udp(l4)?;
                (
                    NetLayer::Ipv6 {
                        ip,
                        udp,
                        ip_raw,
                        udp_raw,
                    },
                    bth_on,
                )
            }
            ETHERTYPE_ROCE_V1 => grh_layer(rest)?,
            _ => return Err(CodecError::NotRoce("ethertype")),
        };
        let packet = RocePacket::parse(bth_on)?;
        Ok(RoceFrame { eth, net, packet })
    }

    /// [`RoceFrame::parse`] of a frame whose Ethernet, IP and UDP headers
    /// `wire::parse` has walked already (`view` is `wire::parse(frame)`, as
    /// the fabric hands it on): the Ethernet header, where the IP and UDP
    /// headers lie and what they carry come from the view, so the L2-L4
    /// walk is not done twice. Decoded here are only what the RoCE layer
    /// reads: the IP header's fields (the ICRC and the engines use them),
    /// the UDP header, and the BTH with its extension headers (a RoCEv1
    /// frame's GRH too). Takes and refuses the frames `parse` does (the
    /// error may name another layer for a frame both refuse), but for an
    /// IPv6 header whose version nibble is not 6: no IPv6 to the view, so
    /// refused here.
    pub fn from_parsed(frame: &'a [u8], view: &::wire::ParsedFrame) -> Result<RoceFrame<'a>> {
        let l2 = view.l2.ok_or(CodecError::Truncated {
            what: "Ethernet",
            need: 14,
            have: frame.len(),
        })?;
        // roce-model's Ethernet header knows the 802.1Q tag only.
        let vlan_tci = match l2.vlan {
            None => None,
            Some(t) if t.tpid == ETHERTYPE_VLAN => Some(t.tci),
            Some(_) => return Err(CodecError::NotRoce("ethertype")),
        };
        let eth = EthernetHeader {
            dst: l2.dst,
            src: l2.src,
            vlan_tci,
            ethertype: l2.ethertype,
        };
        if l2.ethertype == ETHERTYPE_ROCE_V1 {
            let rest = frame.get(l2.header_len..).unwrap_or(&[]);
            let (net, bth_on) = grh_layer(rest)?;
            let packet = RocePacket::parse(bth_on)?;
            return Ok(RoceFrame { eth, net, packet });
        }
        let (Some(l3), Some(_)) = (view.l3, view.l4) else {
            return Err(CodecError::NotRoce(match l2.ethertype {
                ETHERTYPE_IPV4 | ETHERTYPE_IPV6 => "no UDP header after IP",
                _ => "ethertype",
            }));
        };
        if l3.protocol() != IPPROTO_UDP {
            return Err(CodecError::NotRoce("IP protocol is not UDP"));
        }
        let ip_raw = frame
            .get(view.l3_offset..view.l4_offset)
            .ok_or(CodecError::NotRoce("IP header"))?;
        let l4_bytes = frame
            .get(view.l4_offset..view.l3_end)
            .ok_or(CodecError::NotRoce("UDP header"))?;
        // The view clamps the datagram to the frame; RoCE wants the IP
        // length fields to fit in it.
        let in_frame = frame.len().saturating_sub(view.l3_offset);
        let (udp, udp_raw, bth_on) = parse_udp(l4_bytes)?;
        let net = match l3 {
            ::wire::parse::L3::V4(_) => {
                let (ip, _) = Ipv4Header::parse(ip_raw)?;
                let total = usize::from(ip.total_len);
                if total > in_frame {
                    return Err(CodecError::LengthMismatch {
                        what: "IPv4 total",
                        declared: total,
                        actual: in_frame,
                    });
                }
                NetLayer::Ipv4 {
                    ip,
                    udp,
                    ip_raw,
                    udp_raw,
                }
            }
            ::wire::parse::L3::V6(info) => {
                // RoCEv2 puts UDP right after the fixed header.
                if info.has_ext_headers {
                    return Err(CodecError::NotRoce("IPv6 next header is not UDP"));
                }
                let ip = Ipv6Header::parse(ip_raw)?;
                let pl = usize::from(ip.payload_len);
                let after = in_frame.saturating_sub(Ipv6Header::LEN);
                if pl > after {
                    return Err(CodecError::LengthMismatch {
                        what: "IPv6 payload",
                        declared: pl,
                        actual: after,
                    });
                }
                NetLayer::Ipv6 {
                    ip,
                    udp,
                    ip_raw,
                    udp_raw,
                }
            }
        };
        let packet = RocePacket::parse(bth_on)?;
        Ok(RoceFrame { eth, net, packet })
    }

    /// ICRC scope of this frame.
    pub fn icrc_scope(&self) -> IcrcScope<'a> {
        self.net.icrc_scope()
    }

    /// Check the packet's ICRC.
    pub fn verify_icrc(&self) -> Result<()> {
        self.packet.verify_icrc(&self.icrc_scope())
    }
}

/// A RoCEv1 frame's GRH (right after the Ethernet header) and the bytes
/// from the BTH on.
fn grh_layer(rest: &[u8]) -> Result<(NetLayer<'_>, &[u8])> {
    let grh = Grh::parse(rest)?;
    if grh.next_header != GRH_NEXT_HEADER_BTH {
        return Err(CodecError::NotRoce("GRH next header is not BTH"));
    }
    let (grh_raw, after) = rest.split_at(Ipv6Header::LEN);
    let pl = usize::from(grh.payload_len);
    let bth_on = after.get(..pl).ok_or(CodecError::LengthMismatch {
        what: "GRH payload",
        declared: pl,
        actual: after.len(),
    })?;
    Ok((NetLayer::Grh { grh, grh_raw }, bth_on))
}

fn parse_udp(l4: &[u8]) -> Result<(UdpHeader, &[u8], &[u8])> {
    let udp = UdpHeader::parse(l4)?;
    if udp.dst_port != ROCEV2_PORT {
        return Err(CodecError::NotRoce("UDP destination port is not 4791"));
    }
    let ul = usize::from(udp.len);
    if ul != l4.len() {
        return Err(CodecError::LengthMismatch {
            what: "UDP",
            declared: ul,
            actual: l4.len(),
        });
    }
    let (raw, rest) = l4.split_at(UdpHeader::LEN);
    Ok((udp, raw, rest))
}

/// Network-layer parameters for [`FrameBuilder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetParams {
    /// RoCEv2 / IPv4 (DF set, UDP checksum 0).
    Ipv4 {
        /// Source address.
        src: [u8; 4],
        /// Destination address.
        dst: [u8; 4],
        /// DSCP/ECN byte.
        tos: u8,
        /// TTL.
        ttl: u8,
        /// IP identification.
        ident: u16,
        /// UDP source port (flow entropy).
        udp_src_port: u16,
    },
    /// RoCEv2 / IPv6 (UDP checksum computed).
    Ipv6 {
        /// Source address.
        src: [u8; 16],
        /// Destination address.
        dst: [u8; 16],
        /// Traffic class.
        traffic_class: u8,
        /// Flow label (20 bits).
        flow_label: u32,
        /// Hop limit.
        hop_limit: u8,
        /// UDP source port (flow entropy).
        udp_src_port: u16,
    },
    /// RoCEv1 (Ethertype 0x8915) with a GRH.
    Grh {
        /// Source GID.
        sgid: [u8; 16],
        /// Destination GID.
        dgid: [u8; 16],
        /// Traffic class.
        traffic_class: u8,
        /// Flow label (20 bits).
        flow_label: u32,
        /// Hop limit.
        hop_limit: u8,
    },
}

/// Builds complete Ethernet frames around a [`PacketBuilder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameBuilder {
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Optional 802.1Q TCI.
    pub vlan_tci: Option<u16>,
    /// Network layer.
    pub net: NetParams,
}

impl FrameBuilder {
    /// Bytes of outer headers in front of the BTH: Ethernet (+ VLAN) and
    /// IPv4 + UDP, IPv6 + UDP or the GRH.
    pub fn header_len(&self) -> usize {
        let eth = if self.vlan_tci.is_some() { 18 } else { 14 };
        eth + match self.net {
            NetParams::Ipv4 { .. } => 20 + UdpHeader::LEN,
            NetParams::Ipv6 { .. } => Ipv6Header::LEN + UdpHeader::LEN,
            NetParams::Grh { .. } => Grh::LEN,
        }
    }

    /// Emit the whole frame (no FCS) with lengths, IPv4 checksum, IPv6 UDP
    /// checksum and ICRC filled in.
    pub fn build(&self, pkt: &PacketBuilder<'_>) -> Result<Vec<u8>> {
        let body = pkt.build_unsealed()?;
        let mut out = vec![0u8; self.header_len()];
        out.extend_from_slice(&body);
        self.wrap_in_place(&mut out)?;
        Ok(out)
    }

    /// Finish a frame in place: `frame[..header_len()]` is room for the outer
    /// headers, the rest an unsealed BTH..ICRC packet (as
    /// [`crate::QueuePair::poll_transmit_into`] writes it). Writes the
    /// headers with their lengths and checksums and seals the ICRC, so a
    /// payload is never copied to add headers.
    pub fn wrap_in_place(&self, frame: &mut [u8]) -> Result<()> {
        let hl = self.header_len();
        if frame.len() < hl + ICRC_LEN {
            return Err(CodecError::BufferTooSmall {
                need: hl + ICRC_LEN,
                have: frame.len(),
            });
        }
        let body_len = frame.len() - hl;
        let ethertype = match self.net {
            NetParams::Ipv4 { .. } => ETHERTYPE_IPV4,
            NetParams::Ipv6 { .. } => ETHERTYPE_IPV6,
            NetParams::Grh { .. } => ETHERTYPE_ROCE_V1,
        };
        let eth = EthernetHeader {
            dst: self.dst_mac,
            src: self.src_mac,
            vlan_tci: self.vlan_tci,
            ethertype,
        };
        let e = eth.write(frame);
        let too_long = |n: usize| CodecError::FieldRange {
            field: "frame length",
            value: n as u64,
            bits: 16,
        };
        let (head, body) = frame.split_at_mut(hl);
        match self.net {
            NetParams::Ipv4 {
                src,
                dst,
                tos,
                ttl,
                ident,
                udp_src_port,
            } => {
                let udp_len = body_len + UdpHeader::LEN;
                let total = u16::try_from(udp_len + 20).map_err(|_| too_long(udp_len + 20))?;
                let ip = Ipv4Header {
                    tos,
                    total_len: total,
                    ident,
                    flags_frag: Ipv4Header::DF,
                    ttl,
                    protocol: IPPROTO_UDP,
                    checksum: 0,
                    src,
                    dst,
                }
                .emit();
                let udp = UdpHeader {
                    src_port: udp_src_port,
                    dst_port: ROCEV2_PORT,
                    len: udp_len as u16,
                    checksum: 0,
                }
                .emit();
                IcrcScope::Ipv4 { ip: &ip, udp: &udp }.seal(body)?;
                head[e..e + 20].copy_from_slice(&ip);
                head[e + 20..].copy_from_slice(&udp);
            }
            NetParams::Ipv6 {
                src,
                dst,
                traffic_class,
                flow_label,
                hop_limit,
                udp_src_port,
            } => {
                let udp_len = u16::try_from(body_len + UdpHeader::LEN)
                    .map_err(|_| too_long(body_len + UdpHeader::LEN))?;
                let ip = Ipv6Header {
                    version: 6,
                    traffic_class,
                    flow_label,
                    payload_len: udp_len,
                    next_header: IPPROTO_UDP,
                    hop_limit,
                    src,
                    dst,
                }
                .emit();
                let mut udp = UdpHeader {
                    src_port: udp_src_port,
                    dst_port: ROCEV2_PORT,
                    len: udp_len,
                    checksum: 0,
                };
                IcrcScope::Ipv6 {
                    ip: &ip,
                    udp: &udp.emit(),
                }
                .seal(body)?;
                let u = e + Ipv6Header::LEN;
                head[e..u].copy_from_slice(&ip);
                head[u..].copy_from_slice(&udp.emit());
                // The UDP checksum covers the UDP header and the sealed body,
                // which follow each other in the frame.
                let seg = &frame[u..];
                let pseudo = pseudo_v6(&src, &dst, IPPROTO_UDP, seg.len());
                udp.checksum = finish_udp(ones_sum(seg, pseudo));
                frame[u..u + UdpHeader::LEN].copy_from_slice(&udp.emit());
            }
            NetParams::Grh {
                sgid,
                dgid,
                traffic_class,
                flow_label,
                hop_limit,
            } => {
                let pl = u16::try_from(body_len).map_err(|_| too_long(body_len))?;
                let grh = Grh {
                    version: 6,
                    traffic_class,
                    flow_label,
                    payload_len: pl,
                    next_header: GRH_NEXT_HEADER_BTH,
                    hop_limit,
                    src: sgid,
                    dst: dgid,
                }
                .emit();
                IcrcScope::Grh(&grh).seal(body)?;
                head[e..].copy_from_slice(&grh);
            }
        }
        Ok(())
    }
}

/// A parsed native InfiniBand packet (LRH first; as captured in ERF type 21).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IbFrame<'a> {
    /// Local route header.
    pub lrh: Lrh,
    /// Global route header if LNH = 3.
    pub grh: Option<Grh>,
    /// Transport packet.
    pub packet: RocePacket<'a>,
    /// Variant CRC (2 bytes after the ICRC) if present in the buffer.
    pub vcrc: Option<[u8; 2]>,
    lrh_raw: &'a [u8],
    grh_raw: Option<&'a [u8]>,
    lrh_to_icrc: &'a [u8],
}

impl<'a> IbFrame<'a> {
    /// Parse LRH [GRH] BTH .. ICRC [VCRC]. The LRH packet length delimits the
    /// packet; 2 more bytes, if present, are taken as the VCRC.
    pub fn parse(buf: &'a [u8]) -> Result<IbFrame<'a>> {
        let lrh = Lrh::parse(buf)?;
        let plen = usize::from(lrh.pkt_len) * 4;
        let pkt = buf.get(..plen).ok_or(CodecError::LengthMismatch {
            what: "LRH packet",
            declared: plen,
            actual: buf.len(),
        })?;
        if plen < Lrh::LEN {
            return Err(CodecError::LengthMismatch {
                what: "LRH packet",
                declared: plen,
                actual: Lrh::LEN,
            });
        }
        let vcrc = buf.get(plen..plen + 2).map(|v| [v[0], v[1]]);
        let (lrh_raw, after) = pkt.split_at(Lrh::LEN);
        let (grh, grh_raw, bth_on) = match lrh.lnh {
            Lrh::LNH_IBA_LOCAL => (None, None, after),
            Lrh::LNH_IBA_GLOBAL => {
                let g = Grh::parse(after)?;
                if g.next_header != GRH_NEXT_HEADER_BTH {
                    return Err(CodecError::NotRoce("GRH next header is not BTH"));
                }
                let (raw, rest) = after.split_at(Ipv6Header::LEN);
                (Some(g), Some(raw), rest)
            }
            _ => return Err(CodecError::NotRoce("LRH LNH is raw/IP, not IBA transport")),
        };
        let packet = RocePacket::parse(bth_on)?;
        Ok(IbFrame {
            lrh,
            grh,
            packet,
            vcrc,
            lrh_raw,
            grh_raw,
            lrh_to_icrc: pkt,
        })
    }

    /// ICRC scope of this packet.
    pub fn icrc_scope(&self) -> IcrcScope<'a> {
        IcrcScope::Ib {
            lrh: self.lrh_raw,
            grh: self.grh_raw,
        }
    }

    /// Check the ICRC.
    pub fn verify_icrc(&self) -> Result<()> {
        self.packet.verify_icrc(&self.icrc_scope())
    }

    /// Check the VCRC (`Ok(false)` if the buffer did not include one).
    pub fn verify_vcrc(&self) -> Result<bool> {
        let Some(v) = self.vcrc else {
            return Ok(false);
        };
        let found = u16::from_le_bytes(v);
        let computed = crate::icrc::vcrc(self.lrh_to_icrc);
        if computed == found {
            Ok(true)
        } else {
            Err(CodecError::VcrcMismatch { computed, found })
        }
    }
}
