//! ARP (RFC 826) for Ethernet and IPv4, the only kind the daemon meets:
//! a typed view of the packet that follows an untagged Ethernet header,
//! and its builder.

use crate::ethernet::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ETH_HLEN};

/// Length of an Ethernet/IPv4 ARP packet (after the Ethernet header).
pub const ARP_LEN: usize = 28;
/// ARP request.
pub const OP_REQUEST: u16 = 1;
/// ARP reply.
pub const OP_REPLY: u16 = 2;
/// Hardware type Ethernet.
const HTYPE_ETHERNET: u16 = 1;

/// An Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arp {
    /// The operation ([`OP_REQUEST`], [`OP_REPLY`], or another).
    pub op: u16,
    /// Sender hardware address.
    pub sender_mac: [u8; 6],
    /// Sender protocol (IPv4) address.
    pub sender_ip: [u8; 4],
    /// Target hardware address.
    pub target_mac: [u8; 6],
    /// Target protocol (IPv4) address.
    pub target_ip: [u8; 4],
}

impl Arp {
    /// The ARP packet `b` (the bytes after the Ethernet header), if it is
    /// an Ethernet/IPv4 one (hardware type 1, protocol IPv4, lengths 6 and
    /// 4). Never panics.
    pub fn parse(b: &[u8]) -> Option<Arp> {
        let b = b.get(..ARP_LEN)?;
        let be16 = |at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
        if be16(0) != HTYPE_ETHERNET || be16(2) != ETHERTYPE_IPV4 || b[4] != 6 || b[5] != 4 {
            return None;
        }
        let mac = |at: usize| -> [u8; 6] { std::array::from_fn(|i| b[at + i]) };
        let ip = |at: usize| -> [u8; 4] { std::array::from_fn(|i| b[at + i]) };
        Some(Arp {
            op: be16(6),
            sender_mac: mac(8),
            sender_ip: ip(14),
            target_mac: mac(18),
            target_ip: ip(24),
        })
    }

    /// The ARP packet of an untagged Ethernet frame, if the frame is one.
    pub fn parse_frame(frame: &[u8]) -> Option<Arp> {
        if frame.get(12..14)? != ETHERTYPE_ARP.to_be_bytes() {
            return None;
        }
        Arp::parse(&frame[ETH_HLEN..])
    }

    /// Whether the sender fields say where a host is: not a probe (sender
    /// 0.0.0.0), not a group or all-zero MAC.
    pub fn announces_host(&self) -> bool {
        self.sender_ip != [0; 4] && self.sender_mac[0] & 1 == 0 && self.sender_mac != [0; 6]
    }

    /// Writes the packet into `out[..ARP_LEN]` (`out` must be that long).
    pub fn emit(&self, out: &mut [u8]) {
        let out = &mut out[..ARP_LEN];
        out[0..2].copy_from_slice(&HTYPE_ETHERNET.to_be_bytes());
        out[2..4].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        out[4] = 6;
        out[5] = 4;
        out[6..8].copy_from_slice(&self.op.to_be_bytes());
        out[8..14].copy_from_slice(&self.sender_mac);
        out[14..18].copy_from_slice(&self.sender_ip);
        out[18..24].copy_from_slice(&self.target_mac);
        out[24..28].copy_from_slice(&self.target_ip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emit_then_parse_round_trips_and_bad_headers_are_refused() {
        let a = Arp {
            op: OP_REPLY,
            sender_mac: [2, 0, 0, 0, 0, 1],
            sender_ip: [10, 0, 0, 1],
            target_mac: [2, 0, 0, 0, 0, 2],
            target_ip: [10, 0, 0, 2],
        };
        let mut frame = vec![0xff; ETH_HLEN];
        frame[12..14].copy_from_slice(&ETHERTYPE_ARP.to_be_bytes());
        frame.resize(ETH_HLEN + ARP_LEN, 0);
        a.emit(&mut frame[ETH_HLEN..]);
        assert_eq!(Arp::parse_frame(&frame), Some(a));
        assert!(a.announces_host());
        // Truncated, another hardware type, another ethertype: none.
        assert_eq!(Arp::parse_frame(&frame[..frame.len() - 1]), None);
        let mut f = frame.clone();
        f[ETH_HLEN + 1] = 6;
        assert_eq!(Arp::parse_frame(&f), None);
        let mut f = frame.clone();
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        assert_eq!(Arp::parse_frame(&f), None);
        // A probe (sender 0.0.0.0) announces no host.
        let probe = Arp {
            sender_ip: [0; 4],
            ..a
        };
        assert!(!probe.announces_host());
    }
}
