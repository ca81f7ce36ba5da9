//! IPv4 neighbours the fabric has heard of (learnt from ARP), for RDMA
//! functions that address by IP.
//!
//! Why: a kernel RDMA consumer gives the device the destination MAC in the
//! QP's address vector, and SMC-Rv2 with a RoCEv2-only device gives zeros
//! there: its CLC proposal carries the client's MAC only for SMC-Rv1
//! (`net/smc/smc_clc.c`), and `ib_modify_qp` resolves MACs only for
//! userspace QPs. erdma's own network (a cloud fabric) delivers RoCEv2 by IP
//! address; so does ours: a frame an erdma function sends to MAC
//! 00:00:00:00:00:00 gets the MAC of its destination IPv4 address, as ARP on
//! the fabric announced it. Leaf module: bytes in, answers out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::RwLock;

/// IPv4 address -> MAC, learnt from the sender fields of ARP frames.
#[derive(Debug)]
pub struct NeighborTable {
    map: RwLock<HashMap<[u8; 4], [u8; 6]>>,
    max: usize,
    /// ARP senders not learnt because the table was full.
    pub full: AtomicU64,
}

/// The ARP sender (IPv4, MAC) of an Ethernet/IPv4 ARP frame that
/// announces a host ([`wire::arp::Arp::announces_host`]).
pub fn arp_sender(frame: &[u8]) -> Option<([u8; 4], [u8; 6])> {
    let arp = wire::arp::Arp::parse_frame(frame)?;
    arp.announces_host()
        .then_some((arp.sender_ip, arp.sender_mac))
}

impl NeighborTable {
    /// An empty table of at most `max` entries.
    pub fn new(max: usize) -> Self {
        NeighborTable {
            map: RwLock::new(HashMap::new()),
            max,
            full: AtomicU64::new(0),
        }
    }

    /// Learns from `frame` if it is an ARP frame (cheap otherwise: two byte
    /// compares).
    pub fn observe(&self, frame: &[u8]) {
        let Some((ip, mac)) = arp_sender(frame) else {
            return;
        };
        if self.map.read().is_ok_and(|m| m.get(&ip) == Some(&mac)) {
            return;
        }
        if let Ok(mut m) = self.map.write() {
            if m.len() >= self.max && !m.contains_key(&ip) {
                self.full.fetch_add(1, Relaxed);
                return;
            }
            m.insert(ip, mac);
        }
    }

    /// The MAC last announced for `ip`.
    pub fn resolve(&self, ip: [u8; 4]) -> Option<[u8; 6]> {
        self.map.read().ok()?.get(&ip).copied()
    }

    /// Fills in the destination MAC of an IPv4 frame sent to
    /// 00:00:00:00:00:00. Returns false if the frame needs that and its
    /// destination is unknown (the caller drops it); true otherwise.
    pub fn fill_zero_dmac(&self, frame: &mut [u8]) -> bool {
        use wire::ethernet::{ETHERTYPE_IPV4, ETH_HLEN};
        if frame.len() < ETH_HLEN + wire::ip::IPV4_MIN_HLEN || frame[0..6] != [0; 6] {
            return true;
        }
        if frame[12..14] != ETHERTYPE_IPV4.to_be_bytes() {
            return false;
        }
        // The IPv4 destination address: bytes 16..20 of the header.
        let at = ETH_HLEN + 16;
        let ip: [u8; 4] = [frame[at], frame[at + 1], frame[at + 2], frame[at + 3]];
        match self.resolve(ip) {
            Some(mac) => {
                frame[0..6].copy_from_slice(&mac);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arp(op: u8, mac: [u8; 6], ip: [u8; 4]) -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&mac);
        f.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, op]);
        f.extend_from_slice(&mac);
        f.extend_from_slice(&ip);
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&[10, 0, 0, 9]);
        f
    }

    fn ipv4_to(dst_mac: [u8; 6], ip: [u8; 4]) -> Vec<u8> {
        let mut f = dst_mac.to_vec();
        f.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x00]);
        f.extend_from_slice(&[0x45; 16]);
        f.extend_from_slice(&ip);
        f.extend_from_slice(&[0; 20]);
        f
    }

    #[test]
    fn arp_requests_and_replies_teach_the_sender() {
        let t = NeighborTable::new(8);
        let mac = [0x52, 0x54, 0, 0x77, 1, 0x0b];
        t.observe(&arp(1, mac, [10, 77, 0, 2]));
        assert_eq!(t.resolve([10, 77, 0, 2]), Some(mac));
        let moved = [0x52, 0x54, 0, 0x77, 1, 0x0c];
        t.observe(&arp(2, moved, [10, 77, 0, 2]));
        assert_eq!(t.resolve([10, 77, 0, 2]), Some(moved));
        assert_eq!(t.resolve([10, 77, 0, 3]), None);
    }

    #[test]
    fn probes_group_macs_and_non_arp_frames_teach_nothing() {
        let t = NeighborTable::new(8);
        t.observe(&arp(1, [2, 0, 0, 0, 0, 1], [0, 0, 0, 0]));
        t.observe(&arp(1, [3, 0, 0, 0, 0, 1], [10, 0, 0, 1]));
        t.observe(&ipv4_to([2; 6], [10, 0, 0, 1]));
        t.observe(&[0x08; 20]);
        assert_eq!(t.resolve([10, 0, 0, 1]), None);
        assert_eq!(t.resolve([0, 0, 0, 0]), None);
    }

    #[test]
    fn the_table_is_bounded_and_counts_what_it_refused() {
        let t = NeighborTable::new(2);
        for i in 1..=4u8 {
            t.observe(&arp(1, [2, 0, 0, 0, 0, i], [10, 0, 0, i]));
        }
        assert_eq!(t.full.load(Relaxed), 2);
        assert!(t.resolve([10, 0, 0, 1]).is_some());
        assert_eq!(t.resolve([10, 0, 0, 4]), None);
    }

    #[test]
    fn only_zero_destinations_are_filled() {
        let t = NeighborTable::new(8);
        let mac = [0x52, 0x54, 0, 0x77, 1, 0x0b];
        t.observe(&arp(2, mac, [10, 77, 0, 2]));
        let mut f = ipv4_to([0; 6], [10, 77, 0, 2]);
        assert!(t.fill_zero_dmac(&mut f));
        assert_eq!(f[0..6], mac);
        let mut unknown = ipv4_to([0; 6], [10, 77, 0, 9]);
        assert!(!t.fill_zero_dmac(&mut unknown));
        let mut given = ipv4_to([2; 6], [10, 77, 0, 9]);
        assert!(t.fill_zero_dmac(&mut given));
        assert_eq!(given[0..6], [2; 6]);
        let mut short = vec![0u8; 20];
        assert!(t.fill_zero_dmac(&mut short));
    }
}
