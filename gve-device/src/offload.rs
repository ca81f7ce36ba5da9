//! Checksums and TCP/UDP segmentation: what the device finishes on TX and
//! verifies on RX.
//!
//! DQO TX descriptors carry no checksum start/offset (`gve_desc_dqo.h`), so
//! the device derives them from the headers: the first TCP or UDP header of
//! the frame. It recomputes the L4 checksum from scratch instead of
//! completing the driver's pseudo-header seed; for a well-formed packet the
//! result is the same, and it does not depend on how the stack seeded the
//! field (`gve_prep_tso` removes the length from the seed for TSO).

use wire::ethernet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_QINQ, ETHERTYPE_VLAN};
use wire::parse::{parse, L4Proto, ParsedFrame, L3};

/// `GVE_TX_MIN_TSO_MSS_DQO`.
pub const MIN_TSO_MSS: u32 = 88;
/// `GVE_TX_MAX_TSO_MSS_DQO`.
pub const MAX_TSO_MSS: u32 = 9728;
/// `GVE_TX_MAX_HDR_SIZE_DQO`.
pub const MAX_TSO_HDR: u32 = 255;

/// `ETH_HLEN`.
pub const ETH_HLEN: usize = 14;
/// `VLAN_HLEN`: one 802.1Q / 802.1ad tag.
pub const VLAN_HLEN: usize = 4;

/// Longest frame that fits `mtu`: the Ethernet header, one VLAN tag if the
/// frame carries one (gve is not `NETIF_F_VLAN_CHALLENGED`: a VLAN device
/// on top of it has its MTU), then `mtu` bytes of L3.
pub fn max_frame_len(frame: &[u8], mtu: u16) -> usize {
    let tagged = matches!(
        frame.get(12..14),
        Some(&[a, b]) if matches!(u16::from_be_bytes([a, b]), ETHERTYPE_VLAN | ETHERTYPE_QINQ)
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

/// Ones-complement sum of `data` added to `acc` (not folded).
pub fn sum16(data: &[u8], mut acc: u64) -> u64 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u64::from(u16::from_be_bytes([*last, 0]));
    }
    acc
}

/// Folds a sum to 16 bits and complements it.
pub fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

/// Pseudo-header sum for an L4 segment of `len` bytes.
fn pseudo(p: &ParsedFrame, proto: u8, len: usize) -> Option<u64> {
    let mut acc = 0u64;
    match p.l3? {
        L3::V4(ip) => {
            acc = sum16(&ip.src.octets(), acc);
            acc = sum16(&ip.dst.octets(), acc);
        }
        L3::V6(ip) => {
            acc = sum16(&ip.src.octets(), acc);
            // With a type 2 routing header the final destination is the
            // home address carried in it (RFC 6275 6.4).
            acc = sum16(&ip.rt2_address.unwrap_or(ip.dst).octets(), acc);
        }
    }
    Some(acc + u64::from(proto) + len as u64)
}

fn l4_check_offset(proto: L4Proto) -> usize {
    match proto {
        L4Proto::Tcp => 16,
        L4Proto::Udp => 6,
    }
}

fn proto_num(proto: L4Proto) -> u8 {
    match proto {
        L4Proto::Tcp => 6,
        L4Proto::Udp => 17,
    }
}

/// Writes the TCP/UDP checksum of the first L4 header of `frame`. Returns
/// false (frame untouched) when there is no TCP/UDP header to finish.
pub fn fill_l4_checksum(frame: &mut [u8]) -> bool {
    let p = parse(frame);
    let Some(l4) = p.l4 else {
        return false;
    };
    let (start, end) = (p.l4_offset, p.l3_end);
    let at = start + l4_check_offset(l4.proto);
    if end > frame.len() || at + 2 > end {
        return false;
    }
    let Some(ps) = pseudo(&p, proto_num(l4.proto), end - start) else {
        return false;
    };
    frame[at..at + 2].copy_from_slice(&[0, 0]);
    let mut c = fold(sum16(&frame[start..end], ps));
    if c == 0 && l4.proto == L4Proto::Udp {
        c = 0xffff;
    }
    frame[at..at + 2].copy_from_slice(&c.to_be_bytes());
    true
}

/// Recomputes an IPv4 header checksum in place.
pub(crate) fn fill_ipv4_checksum(hdr: &mut [u8]) {
    if hdr.len() < 20 {
        return;
    }
    hdr[10..12].copy_from_slice(&[0, 0]);
    let c = fold(sum16(hdr, 0));
    hdr[10..12].copy_from_slice(&c.to_be_bytes());
}

/// Offset of the IP header, from the ethertype (one VLAN tag allowed).
fn l3_offset(frame: &[u8]) -> Option<(usize, u16)> {
    let ty = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    if ty == ETHERTYPE_VLAN || ty == ETHERTYPE_QINQ {
        let inner = u16::from_be_bytes([*frame.get(16)?, *frame.get(17)?]);
        return Some((18, inner));
    }
    Some((14, ty))
}

/// Sets the IP length field of `frame` so that the datagram ends at
/// `frame.len()` (capped at 65535), so that the parser accepts a TSO super
/// packet whose length field is 0 (BIG TCP) or stale.
pub(crate) fn fix_ip_len(frame: &mut [u8]) {
    let Some((off, ty)) = l3_offset(frame) else {
        return;
    };
    let rest = frame.len().saturating_sub(off);
    match ty {
        ETHERTYPE_IPV4 if frame.len() >= off + 20 => {
            let l = rest.min(0xffff) as u16;
            frame[off + 2..off + 4].copy_from_slice(&l.to_be_bytes());
        }
        ETHERTYPE_IPV6 if frame.len() >= off + 40 => {
            let l = rest.saturating_sub(40).min(0xffff) as u16;
            frame[off + 4..off + 6].copy_from_slice(&l.to_be_bytes());
        }
        _ => {}
    }
}

/// Splits a TSO/USO super packet into MSS-sized frames with correct IP
/// lengths, IPv4 ids and checksums, TCP sequence numbers and flags (FIN/PSH
/// only on the last segment, CWR only on the first) and L4 checksums.
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
    let (Some(l3), Some(l4)) = (p.l3, p.l4) else {
        return Err(OffloadError::BadHeaderLen(header_len));
    };
    if p.l4_offset + l4.header_len != hl {
        return Err(OffloadError::BadHeaderLen(header_len));
    }
    let l3_off = p.l3_offset;
    let l4_off = p.l4_offset;
    let mss = mss as usize;
    let chunks: Vec<&[u8]> = if payload.is_empty() {
        vec![payload]
    } else {
        payload.chunks(mss).collect()
    };
    let n = chunks.len();
    let mut out = Vec::with_capacity(n);
    let (seq0, ipid0) = (
        u32::from_be_bytes([
            pkt[l4_off + 4],
            pkt[l4_off + 5],
            pkt[l4_off + 6],
            pkt[l4_off + 7],
        ]),
        u16::from_be_bytes([pkt[l3_off + 4], pkt[l3_off + 5]]),
    );
    for (i, chunk) in chunks.into_iter().enumerate() {
        let mut f = Vec::with_capacity(hl + chunk.len());
        f.extend_from_slice(&pkt[..hl]);
        f.extend_from_slice(chunk);
        let l3_len = f.len() - l3_off;
        match l3 {
            L3::V4(_) => {
                f[l3_off + 2..l3_off + 4].copy_from_slice(&(l3_len as u16).to_be_bytes());
                let id = ipid0.wrapping_add(i as u16);
                f[l3_off + 4..l3_off + 6].copy_from_slice(&id.to_be_bytes());
                let ihl = usize::from(f[l3_off] & 0x0f) * 4;
                fill_ipv4_checksum(&mut f[l3_off..l3_off + ihl]);
            }
            L3::V6(_) => {
                let pl = (l3_len - 40) as u16;
                f[l3_off + 4..l3_off + 6].copy_from_slice(&pl.to_be_bytes());
            }
        }
        match l4.proto {
            L4Proto::Tcp => {
                let seq = seq0.wrapping_add((i * mss) as u32);
                f[l4_off + 4..l4_off + 8].copy_from_slice(&seq.to_be_bytes());
                let mut flags = f[l4_off + 13];
                if i + 1 != n {
                    flags &= !(0x01 | 0x08); // FIN, PSH
                }
                if i != 0 {
                    flags &= !0x80; // CWR
                }
                f[l4_off + 13] = flags;
            }
            L4Proto::Udp => {
                let ul = (f.len() - l4_off) as u16;
                f[l4_off + 4..l4_off + 6].copy_from_slice(&ul.to_be_bytes());
            }
        }
        fill_l4_checksum(&mut f);
        out.push(f);
    }
    Ok(out)
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
        v.ip_err = h.is_none_or(|h| fold(sum16(h, 0)) != 0);
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
    v.l4_err = match pseudo(p, proto_num(l4.proto), seg.len()) {
        Some(ps) => fold(sum16(seg, ps)) != 0,
        None => true,
    };
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_of_valid_header_is_zero() {
        // RFC 1071 example-ish: a real IPv4 header.
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(fold(sum16(&h, 0)), 0);
        let mut g = h;
        fill_ipv4_checksum(&mut g);
        assert_eq!(g, h);
    }
}
