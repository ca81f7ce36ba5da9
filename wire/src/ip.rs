//! IPv4 and IPv6: protocol numbers, header lengths and flags, and rewriting
//! the length fields of a datagram.

use crate::ethernet::{ethertype_and_offset, ETHERTYPE_IPV4, ETHERTYPE_IPV6};

/// IP protocol number of ICMP.
pub const IPPROTO_ICMP: u8 = 1;
/// IP protocol number of TCP.
pub const IPPROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;
/// IP protocol number of ICMPv6.
pub const IPPROTO_ICMPV6: u8 = 58;

/// Length of an IPv4 header without options.
pub const IPV4_MIN_HLEN: usize = 20;
/// Length of the IPv6 fixed header.
pub const IPV6_HLEN: usize = 40;

/// IPv4 don't-fragment flag (in the flags/fragment-offset word).
pub const IPV4_DF: u16 = 0x4000;
/// IPv4 more-fragments flag (in the flags/fragment-offset word).
pub const IPV4_MF: u16 = 0x2000;
/// IPv4 fragment-offset mask (in the flags/fragment-offset word).
pub const IPV4_FRAG_OFFSET: u16 = 0x1fff;

/// Sets the IP length field of an Ethernet `frame` (one VLAN tag allowed)
/// so that the datagram ends at `frame.len()` (capped at 65535): IPv4 total
/// length, or IPv6 payload length. Frames that are not IP, or too short to
/// hold the fixed IP header, are left alone. Nothing else is checked, so a
/// segmentation offload can make its super packet (length 0 for BIG TCP,
/// or stale) parseable.
pub fn fix_ip_len(frame: &mut [u8]) {
    let Some((ty, off)) = ethertype_and_offset(frame) else {
        return;
    };
    let rest = frame.len().saturating_sub(off);
    match ty {
        ETHERTYPE_IPV4 if frame.len() >= off + IPV4_MIN_HLEN => {
            let l = rest.min(0xffff) as u16;
            frame[off + 2..off + 4].copy_from_slice(&l.to_be_bytes());
        }
        ETHERTYPE_IPV6 if frame.len() >= off + IPV6_HLEN => {
            let l = rest.saturating_sub(IPV6_HLEN).min(0xffff) as u16;
            frame[off + 4..off + 6].copy_from_slice(&l.to_be_bytes());
        }
        _ => {}
    }
}
