//! Checksums and TCP/UDP segmentation: what the device finishes on TX and
//! verifies on RX.
//!
//! DQO TX descriptors carry no checksum start/offset (`gve_desc_dqo.h`), so
//! the device derives them from the headers: the first TCP or UDP header of
//! the frame. It recomputes the L4 checksum from scratch instead of
//! completing the driver's pseudo-header seed; for a well-formed packet the
//! result is the same, and it does not depend on how the stack seeded the
//! field (`gve_prep_tso` removes the length from the seed for TSO).

use wire::checksum::{pseudo_header, verify};
use wire::ethernet::{is_vlan_tpid, ETH_HLEN, VLAN_HLEN};
use wire::ip::fix_ip_len;
use wire::l4::L4Proto;
use wire::parse::{parse, ParsedFrame, L3};
use wire::tso::SegmentLayout;

/// `GVE_TX_MIN_TSO_MSS_DQO`.
pub const MIN_TSO_MSS: u32 = 88;
/// `GVE_TX_MAX_TSO_MSS_DQO`.
pub const MAX_TSO_MSS: u32 = 9728;
/// `GVE_TX_MAX_HDR_SIZE_DQO`.
pub const MAX_TSO_HDR: u32 = 255;

/// Longest frame that fits `mtu`: the Ethernet header, one VLAN tag if the
/// frame carries one (gve is not `NETIF_F_VLAN_CHALLENGED`: a VLAN device
/// on top of it has its MTU), then `mtu` bytes of L3.
pub fn max_frame_len(frame: &[u8], mtu: u16) -> usize {
    let tagged = matches!(
        frame.get(12..14),
        Some(&[a, b]) if is_vlan_tpid(u16::from_be_bytes([a, b]))
    );
    usize::from(mtu) + ETH_HLEN + if tagged { VLAN_HLEN } else { 0 }
}

/// Why an offload could not be done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OffloadError {
    /// No TCP/UDP header where the TSO context says the headers end.
    #[error("TSO header length {0} does not end a TCP/UDP header")]
    BadHeaderLen(u32),
    /// MSS outside `[88, 9728]`.
    #[error("TSO MSS {0} out of range")]
    BadMss(u32),
    /// `tso_total_len` disagrees with the bytes gathered.
    #[error("TSO total length {ctx} but {actual} payload bytes")]
    BadTotalLen {
        /// From the context descriptor.
        ctx: u32,
        /// Gathered.
        actual: usize,
    },
}

/// Splits a TSO/USO super packet into MSS-sized frames with correct IP
/// lengths, IPv4 ids and checksums, TCP sequence numbers and flags (FIN/PSH
/// only on the last segment, CWR only on the first), UDP lengths and L4
/// checksums ([`wire::tso::segment`]). Checks the context descriptor's
/// MSS, header length and total length first; the headers may carry IPv6
/// extension headers.
pub fn segment(
    pkt: &[u8],
    header_len: u32,
    mss: u32,
    total_len: u32,
) -> Result<Vec<Vec<u8>>, OffloadError> {
    if !(MIN_TSO_MSS..=MAX_TSO_MSS).contains(&mss) {
        return Err(OffloadError::BadMss(mss));
    }
    let hl = header_len as usize;
    if header_len > MAX_TSO_HDR || hl > pkt.len() {
        return Err(OffloadError::BadHeaderLen(header_len));
    }
    let payload = &pkt[hl..];
    if payload.len() != total_len as usize {
        return Err(OffloadError::BadTotalLen {
            ctx: total_len,
            actual: payload.len(),
        });
    }
    // Parse the headers with the length field fixed up to cover the packet.
    let mut probe = pkt[..hl].to_vec();
    probe.extend_from_slice(&payload[..payload.len().min(1)]);
    fix_ip_len(&mut probe);
    let p = parse(&probe);
    let Some(l4) = p.l4 else {
        return Err(OffloadError::BadHeaderLen(header_len));
    };
    if p.l4_offset + l4.header_len != hl {
        return Err(OffloadError::BadHeaderLen(header_len));
    }
    let lay = SegmentLayout::from_parsed(&p).ok_or(OffloadError::BadHeaderLen(header_len))?;
    Ok(wire::tso::segment(pkt, &lay, mss as usize))
}

/// Receive checksum verdict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RxCsum {
    /// L3 and L4 were recognised and checked (`l3_l4_processed`).
    pub processed: bool,
    /// IPv4 header checksum wrong (`csum_ip_err`).
    pub ip_err: bool,
    /// TCP/UDP checksum wrong (`csum_l4_err`).
    pub l4_err: bool,
}

/// Verifies the IPv4 header checksum and the TCP/UDP checksum. The kernel
/// cannot do it for payload in unreadable (devmem) buffers, so the device
/// must.
pub fn verify_rx(frame: &[u8], p: &ParsedFrame) -> RxCsum {
    let mut v = RxCsum::default();
    let (Some(l3), Some(l4)) = (p.l3, p.l4) else {
        return v;
    };
    if let L3::V6(ip) = l3 {
        if ip.ext_truncated {
            return v;
        }
    }
    v.processed = true;
    if let L3::V4(ip) = l3 {
        let h = frame.get(p.l3_offset..p.l3_offset + ip.header_len);
        v.ip_err = h.is_none_or(|h| !verify(h, 0));
    }
    let (start, end) = (p.l4_offset, p.l3_end);
    let Some(seg) = frame.get(start..end) else {
        v.l4_err = true;
        return v;
    };
    if l4.proto == L4Proto::Udp {
        let ck = seg.get(6..8).map(|b| u16::from_be_bytes([b[0], b[1]]));
        if matches!(l3, L3::V4(_)) && ck == Some(0) {
            return v; // no UDP checksum over IPv4
        }
    }
    v.l4_err = match pseudo_header(p, l4.proto.number(), seg.len()) {
        Some(ps) => !verify(seg, ps),
        None => true,
    };
    v
}
