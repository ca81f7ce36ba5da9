//! Hand-written Ethernet/IPv4/IPv6/TCP/UDP builders and checkers for the tests.
//!
//! Everything here is deliberately independent of the daemon: the tests verify
//! checksums and segmentation with this code, not with the code under test.

use super::guest::NetHdr;

// The protocol constants are wire's (values, not logic: the checks below
// stay independent of the code under test). Each test uses some of them.
#[allow(unused_imports)]
pub use wire::ethernet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETH_HLEN};
#[allow(unused_imports)]
pub use wire::ip::{IPPROTO_TCP, IPPROTO_UDP};
#[allow(unused_imports)]
pub use wire::l4::{TCP_ACK, TCP_CWR, TCP_FIN, TCP_PSH, TCP_SYN};

pub const BROADCAST: [u8; 6] = [0xff; 6];

/// One's-complement sum of `data` added to `initial` (not folded, not inverted).
pub fn csum_add(initial: u32, data: &[u8]) -> u32 {
    let mut sum = initial as u64;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u16::from_be_bytes([c[0], c[1]]) as u64;
    }
    if let [last] = chunks.remainder() {
        sum += (*last as u64) << 8;
    }
    while sum >> 32 != 0 {
        sum = (sum & 0xffff_ffff) + (sum >> 32);
    }
    sum as u32
}

/// Folds a 32-bit one's-complement sum to 16 bits (not inverted).
pub fn csum_fold(mut sum: u32) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// Internet checksum of `data` (inverted, ready to store).
pub fn inet_csum(data: &[u8]) -> u16 {
    !csum_fold(csum_add(0, data))
}

/// Pseudo-header sum (not folded) for an L4 segment of `l4_len` bytes.
pub fn pseudo_sum(src: &[u8], dst: &[u8], proto: u8, l4_len: usize) -> u32 {
    let mut s = csum_add(0, src);
    s = csum_add(s, dst);
    if src.len() == 4 {
        s = csum_add(s, &[0, proto]);
        s = csum_add(s, &(l4_len as u16).to_be_bytes());
    } else {
        s = csum_add(s, &(l4_len as u32).to_be_bytes());
        s = csum_add(s, &[0, 0, 0, proto]);
    }
    s
}

pub fn mac(last: u8) -> [u8; 6] {
    [0x52, 0x54, 0x00, 0x00, 0x00, last]
}

pub fn eth_frame(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(ETH_HLEN + payload.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// A raw Ethernet frame with an experimental ethertype and a recognisable payload:
/// `tag` (8 bytes, big endian) followed by a byte pattern derived from it.
pub fn tagged_frame(dst: [u8; 6], src: [u8; 6], tag: u64, len: usize) -> Vec<u8> {
    assert!(len >= ETH_HLEN + 8);
    let mut payload = Vec::with_capacity(len - ETH_HLEN);
    payload.extend_from_slice(&tag.to_be_bytes());
    let mut x = tag.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while payload.len() < len - ETH_HLEN {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        payload.push(x as u8);
    }
    eth_frame(dst, src, 0x88b5, &payload)
}

/// The tag of a frame built by [`tagged_frame`], if it is one.
pub fn frame_tag(frame: &[u8]) -> Option<u64> {
    if frame.len() < ETH_HLEN + 8 || frame[12..14] != [0x88, 0xb5] {
        return None;
    }
    Some(u64::from_be_bytes(frame[14..22].try_into().unwrap()))
}

/// How the L4 checksum of a built frame is filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L4Csum {
    /// Complete, correct checksum.
    Full,
    /// Linux CHECKSUM_PARTIAL convention: the field holds the folded pseudo-header
    /// sum; the header asks the device to finish it (NEEDS_CSUM).
    Partial,
}

/// Parameters of an IPv4 or IPv6 flow.
#[derive(Clone, Debug)]
pub struct Flow {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    /// 4 bytes for IPv4, 16 bytes for IPv6.
    pub src_ip: Vec<u8>,
    pub dst_ip: Vec<u8>,
    pub sport: u16,
    pub dport: u16,
}

impl Flow {
    pub fn v4(src_mac: [u8; 6], dst_mac: [u8; 6], sport: u16, dport: u16) -> Flow {
        Flow {
            src_mac,
            dst_mac,
            src_ip: vec![10, 0, 0, src_mac[5]],
            dst_ip: vec![10, 0, 0, dst_mac[5]],
            sport,
            dport,
        }
    }
    pub fn v6(src_mac: [u8; 6], dst_mac: [u8; 6], sport: u16, dport: u16) -> Flow {
        let mut s = vec![0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        let mut d = s.clone();
        s[15] = src_mac[5];
        d[15] = dst_mac[5];
        Flow {
            src_mac,
            dst_mac,
            src_ip: s,
            dst_ip: d,
            sport,
            dport,
        }
    }
    fn is_v4(&self) -> bool {
        self.src_ip.len() == 4
    }
    pub fn l3_len(&self) -> usize {
        if self.is_v4() {
            20
        } else {
            40
        }
    }
}

fn ip_header(flow: &Flow, proto: u8, l4_len: usize, ip_id: u16) -> Vec<u8> {
    if flow.is_v4() {
        let total = 20 + l4_len;
        assert!(total <= 0xffff, "IPv4 packet too long");
        let mut h = vec![0u8; 20];
        h[0] = 0x45;
        h[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        h[4..6].copy_from_slice(&ip_id.to_be_bytes());
        h[6] = 0x40; // DF
        h[8] = 64;
        h[9] = proto;
        h[12..16].copy_from_slice(&flow.src_ip);
        h[16..20].copy_from_slice(&flow.dst_ip);
        let c = inet_csum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h
    } else {
        let mut h = vec![0u8; 40];
        h[0] = 0x60;
        h[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
        h[6] = proto;
        h[7] = 64;
        h[8..24].copy_from_slice(&flow.src_ip);
        h[24..40].copy_from_slice(&flow.dst_ip);
        h
    }
}

fn finish_l4(flow: &Flow, proto: u8, l4: &mut [u8], csum_off: usize, mode: L4Csum) {
    let ps = pseudo_sum(&flow.src_ip, &flow.dst_ip, proto, l4.len());
    l4[csum_off..csum_off + 2].copy_from_slice(&[0, 0]);
    match mode {
        L4Csum::Full => {
            let mut c = !csum_fold(csum_add(ps, l4));
            if proto == IPPROTO_UDP && c == 0 {
                c = 0xffff;
            }
            l4[csum_off..csum_off + 2].copy_from_slice(&c.to_be_bytes());
        }
        L4Csum::Partial => {
            l4[csum_off..csum_off + 2].copy_from_slice(&csum_fold(ps).to_be_bytes());
        }
    }
}

fn ethertype(flow: &Flow) -> u16 {
    if flow.is_v4() {
        ETHERTYPE_IPV4
    } else {
        ETHERTYPE_IPV6
    }
}

/// A UDP frame; with `L4Csum::Partial` the returned header carries NEEDS_CSUM.
pub fn udp_frame(flow: &Flow, payload: &[u8], mode: L4Csum) -> (Vec<u8>, NetHdr) {
    let mut l4 = vec![0u8; 8];
    l4[0..2].copy_from_slice(&flow.sport.to_be_bytes());
    l4[2..4].copy_from_slice(&flow.dport.to_be_bytes());
    l4[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    l4.extend_from_slice(payload);
    finish_l4(flow, IPPROTO_UDP, &mut l4, 6, mode);
    let mut pkt = ip_header(flow, IPPROTO_UDP, l4.len(), 0x1234);
    pkt.extend_from_slice(&l4);
    let frame = eth_frame(flow.dst_mac, flow.src_mac, ethertype(flow), &pkt);
    let hdr = match mode {
        L4Csum::Full => NetHdr::default(),
        L4Csum::Partial => NetHdr::needs_csum((ETH_HLEN + flow.l3_len()) as u16, 6),
    };
    (frame, hdr)
}

/// A TCP frame (20-byte TCP header, no options).
pub fn tcp_frame(
    flow: &Flow,
    seq: u32,
    flags: u8,
    payload: &[u8],
    mode: L4Csum,
) -> (Vec<u8>, NetHdr) {
    let mut l4 = vec![0u8; 20];
    l4[0..2].copy_from_slice(&flow.sport.to_be_bytes());
    l4[2..4].copy_from_slice(&flow.dport.to_be_bytes());
    l4[4..8].copy_from_slice(&seq.to_be_bytes());
    l4[8..12].copy_from_slice(&0x0102_0304u32.to_be_bytes());
    l4[12] = 5 << 4;
    l4[13] = flags;
    l4[14..16].copy_from_slice(&0xfaf0u16.to_be_bytes());
    l4.extend_from_slice(payload);
    finish_l4(flow, IPPROTO_TCP, &mut l4, 16, mode);
    let mut pkt = ip_header(flow, IPPROTO_TCP, l4.len(), 0x4321);
    pkt.extend_from_slice(&l4);
    let frame = eth_frame(flow.dst_mac, flow.src_mac, ethertype(flow), &pkt);
    let hdr = match mode {
        L4Csum::Full => NetHdr::default(),
        L4Csum::Partial => NetHdr::needs_csum((ETH_HLEN + flow.l3_len()) as u16, 16),
    };
    (frame, hdr)
}

/// A TSO frame the way a Linux guest hands it to virtio-net: one big TCP frame,
/// IP total length covering everything, TCP checksum field = pseudo-header sum
/// (CHECKSUM_PARTIAL), header with NEEDS_CSUM and GSO TCPV4/TCPV6.
pub fn tso_frame(flow: &Flow, seq: u32, flags: u8, payload: &[u8], mss: u16) -> (Vec<u8>, NetHdr) {
    let (frame, mut hdr) = tcp_frame(flow, seq, flags, payload, L4Csum::Partial);
    hdr.gso_type = if flow.is_v4() {
        super::guest::GSO_TCPV4
    } else {
        super::guest::GSO_TCPV6
    };
    hdr.gso_size = mss;
    hdr.hdr_len = (ETH_HLEN + flow.l3_len() + 20) as u16;
    (frame, hdr)
}

/// Parsed view of an IPv4/IPv6 + TCP/UDP frame.
#[derive(Clone, Debug)]
pub struct Parsed {
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
    pub v4: bool,
    pub l3_off: usize,
    pub l4_off: usize,
    pub proto: u8,
    /// IPv4 total length / IPv6 payload length as written in the header.
    pub ip_len_field: usize,
    pub ip_id: u16,
    pub ip_csum_ok: bool,
    pub src_ip: Vec<u8>,
    pub dst_ip: Vec<u8>,
    pub sport: u16,
    pub dport: u16,
    pub tcp_seq: u32,
    pub tcp_flags: u8,
    pub l4_hdr_len: usize,
    pub l4_csum: u16,
    /// Checksum over pseudo header + L4 segment verifies.
    pub l4_csum_ok: bool,
    pub payload: Vec<u8>,
}

/// Parses an Ethernet/IP/TCP-or-UDP frame; Err with a reason otherwise.
pub fn parse(frame: &[u8]) -> Result<Parsed, String> {
    if frame.len() < ETH_HLEN {
        return Err(format!("frame too short: {}", frame.len()));
    }
    let et = u16::from_be_bytes([frame[12], frame[13]]);
    let l3 = ETH_HLEN;
    let (v4, l4_off, proto, ip_len_field, ip_id, ip_csum_ok, src_ip, dst_ip, l3_end) = match et {
        ETHERTYPE_IPV4 => {
            if frame.len() < l3 + 20 {
                return Err("truncated IPv4 header".into());
            }
            let ihl = (frame[l3] & 0xf) as usize * 4;
            let tot = u16::from_be_bytes([frame[l3 + 2], frame[l3 + 3]]) as usize;
            let ok = inet_csum(&frame[l3..l3 + ihl]) == 0;
            (
                true,
                l3 + ihl,
                frame[l3 + 9],
                tot,
                u16::from_be_bytes([frame[l3 + 4], frame[l3 + 5]]),
                ok,
                frame[l3 + 12..l3 + 16].to_vec(),
                frame[l3 + 16..l3 + 20].to_vec(),
                l3 + tot,
            )
        }
        ETHERTYPE_IPV6 => {
            if frame.len() < l3 + 40 {
                return Err("truncated IPv6 header".into());
            }
            let plen = u16::from_be_bytes([frame[l3 + 4], frame[l3 + 5]]) as usize;
            (
                false,
                l3 + 40,
                frame[l3 + 6],
                plen,
                0,
                true,
                frame[l3 + 8..l3 + 24].to_vec(),
                frame[l3 + 24..l3 + 40].to_vec(),
                l3 + 40 + plen,
            )
        }
        _ => return Err(format!("not IP: ethertype {et:#06x}")),
    };
    if l3_end > frame.len() {
        return Err(format!(
            "IP length field says the packet ends at {l3_end}, frame has {} bytes",
            frame.len()
        ));
    }
    let l4 = &frame[l4_off..l3_end];
    let l4_hdr_len = match proto {
        IPPROTO_TCP => {
            if l4.len() < 20 {
                return Err("truncated TCP header".into());
            }
            (l4[12] >> 4) as usize * 4
        }
        IPPROTO_UDP => 8,
        p => return Err(format!("unexpected L4 protocol {p}")),
    };
    if l4.len() < l4_hdr_len {
        return Err("truncated L4 header".into());
    }
    let csum_off = if proto == IPPROTO_TCP { 16 } else { 6 };
    let l4_csum = u16::from_be_bytes([l4[csum_off], l4[csum_off + 1]]);
    let ps = pseudo_sum(&src_ip, &dst_ip, proto, l4.len());
    let l4_csum_ok = csum_fold(csum_add(ps, l4)) == 0xffff;
    Ok(Parsed {
        dst_mac: frame[0..6].try_into().unwrap(),
        src_mac: frame[6..12].try_into().unwrap(),
        v4,
        l3_off: l3,
        l4_off,
        proto,
        ip_len_field,
        ip_id,
        ip_csum_ok,
        src_ip,
        dst_ip,
        sport: u16::from_be_bytes([l4[0], l4[1]]),
        dport: u16::from_be_bytes([l4[2], l4[3]]),
        tcp_seq: if proto == IPPROTO_TCP {
            u32::from_be_bytes(l4[4..8].try_into().unwrap())
        } else {
            0
        },
        tcp_flags: if proto == IPPROTO_TCP { l4[13] } else { 0 },
        l4_hdr_len,
        l4_csum,
        l4_csum_ok,
        payload: l4[l4_hdr_len..].to_vec(),
    })
}

/// A deterministic payload of `len` bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(seed as u32 * 7) as u8 ^ (i >> 8) as u8)
        .collect()
}

/// Returns the frame with the L4 checksum completed the way a device would
/// complete a NEEDS_CSUM frame, for comparisons.
pub fn complete_csum(frame: &[u8], hdr: &NetHdr) -> Vec<u8> {
    let mut f = frame.to_vec();
    let start = hdr.csum_start as usize;
    let off = start + hdr.csum_offset as usize;
    let c = !csum_fold(csum_add(0, &f[start..]));
    f[off..off + 2].copy_from_slice(&c.to_be_bytes());
    f
}
