//! Ethernet II and 802.1Q/802.1ad: header lengths, ethertypes, and where the
//! IP header starts.

/// Ethernet header length without a VLAN tag (`ETH_HLEN`).
pub const ETH_HLEN: usize = 14;
/// Length of one 802.1Q / 802.1ad tag (`VLAN_HLEN`).
pub const VLAN_HLEN: usize = 4;
/// Length of a MAC address.
pub const ETH_ALEN: usize = 6;

/// IPv4 ethertype.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// ARP ethertype.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// 802.1Q customer VLAN TPID.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// 802.1ad service VLAN TPID (accepted as the single tag too).
pub const ETHERTYPE_QINQ: u16 = 0x88a8;
/// IPv6 ethertype.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// RoCEv1 ethertype (an InfiniBand GRH follows).
pub const ETHERTYPE_ROCE_V1: u16 = 0x8915;

/// Whether `ethertype` is a VLAN TPID this crate accepts as a tag (802.1Q or
/// 802.1ad).
pub fn is_vlan_tpid(ethertype: u16) -> bool {
    ethertype == ETHERTYPE_VLAN || ethertype == ETHERTYPE_QINQ
}

/// The ethertype after at most one VLAN tag and the offset of the header
/// behind it; `None` for a frame too short to hold them. Reads only the
/// Ethernet header (and tag): nothing above it is checked.
pub fn ethertype_and_offset(frame: &[u8]) -> Option<(u16, usize)> {
    let ty = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    if is_vlan_tpid(ty) {
        let inner = u16::from_be_bytes([*frame.get(16)?, *frame.get(17)?]);
        return Some((inner, ETH_HLEN + VLAN_HLEN));
    }
    Some((ty, ETH_HLEN))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_tag_is_skipped() {
        let mut f = vec![0u8; 18];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
        assert_eq!(ethertype_and_offset(&f), Some((ETHERTYPE_IPV6, 14)));
        for tpid in [ETHERTYPE_VLAN, ETHERTYPE_QINQ] {
            f[12..14].copy_from_slice(&tpid.to_be_bytes());
            f[16..18].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
            assert_eq!(ethertype_and_offset(&f), Some((ETHERTYPE_IPV4, 18)));
            assert_eq!(ethertype_and_offset(&f[..17]), None);
        }
        assert_eq!(ethertype_and_offset(&f[..13]), None);
    }
}
