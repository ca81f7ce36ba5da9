//! RSS: Toeplitz hash over the hash types the driver enabled, and the
//! indirection table (`gve_adminq_configure_rss`, `gve_adminq_query_rss`).
//!
//! The hash itself is `devmem_nic`'s: gve's `GVE_RSS_HASH_*` bits map one
//! to one onto the virtio-net hash types it implements.

use devmem_nic::{hash_types, HashConfig, DEFAULT_RSS_KEY};
use wire::parse::ParsedFrame;

/// Key size advertised in the RSS_CONFIG option (`GVE_RSS_KEY_SIZE`).
pub const KEY_SIZE: usize = 40;
/// Indirection table size advertised (`GVE_RSS_INDIR_SIZE`).
pub const LUT_SIZE: usize = 128;

/// `enum gve_rss_hash_type` bits.
pub mod gve_hash {
    /// IPv4 2-tuple.
    pub const IPV4: u16 = 1 << 0;
    /// TCP over IPv4.
    pub const TCPV4: u16 = 1 << 1;
    /// IPv6 2-tuple.
    pub const IPV6: u16 = 1 << 2;
    /// IPv6 with extension-header addresses.
    pub const IPV6_EX: u16 = 1 << 3;
    /// TCP over IPv6.
    pub const TCPV6: u16 = 1 << 4;
    /// TCP over IPv6 with extension-header addresses.
    pub const TCPV6_EX: u16 = 1 << 5;
    /// UDP over IPv4.
    pub const UDPV4: u16 = 1 << 6;
    /// UDP over IPv6.
    pub const UDPV6: u16 = 1 << 7;
    /// UDP over IPv6 with extension-header addresses.
    pub const UDPV6_EX: u16 = 1 << 8;
    /// Every bit the device knows.
    pub const ALL: u16 = (1 << 9) - 1;
    /// What `gve_adminq_configure_rss` always asks for; also the device
    /// default.
    pub const DEFAULT: u16 = TCPV4 | UDPV4 | TCPV6 | UDPV6;
}

/// `ETH_RSS_HASH_TOP`, the only algorithm (Toeplitz).
pub const HASH_ALG_TOP: u8 = 1;

/// Maps `GVE_RSS_HASH_*` bits to `devmem_nic`'s virtio-net hash types.
fn to_virtio(t: u16) -> u32 {
    const MAP: [(u16, u32); 9] = [
        (gve_hash::IPV4, hash_types::IPV4),
        (gve_hash::TCPV4, hash_types::TCPV4),
        (gve_hash::IPV6, hash_types::IPV6),
        (gve_hash::IPV6_EX, hash_types::IP_EX),
        (gve_hash::TCPV6, hash_types::TCPV6),
        (gve_hash::TCPV6_EX, hash_types::TCP_EX),
        (gve_hash::UDPV4, hash_types::UDPV4),
        (gve_hash::UDPV6, hash_types::UDPV6),
        (gve_hash::UDPV6_EX, hash_types::UDP_EX),
    ];
    MAP.iter()
        .filter(|(g, _)| t & g != 0)
        .fold(0, |acc, (_, v)| acc | v)
}

/// The device's RSS state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rss {
    /// Enabled `GVE_RSS_HASH_*` bits.
    pub hash_types: u16,
    /// Toeplitz key.
    pub key: [u8; KEY_SIZE],
    /// The driver's indirection table, once it set one that is not the
    /// default. Until then the device spreads over the RX queues that exist
    /// (the driver only programs a table itself when the device does not
    /// offer the RSS_CONFIG option, or for `ethtool -X`); see
    /// [`Rss::set_table`].
    pub lut: Option<Vec<u32>>,
}

impl Default for Rss {
    fn default() -> Self {
        Rss {
            hash_types: gve_hash::DEFAULT,
            key: DEFAULT_RSS_KEY,
            lut: None,
        }
    }
}

impl Rss {
    /// The Toeplitz hash of a frame, if an enabled hash type applies.
    pub fn hash(&self, p: &ParsedFrame) -> Option<u32> {
        let cfg = HashConfig {
            key: self.key.to_vec(),
            hash_types: to_virtio(self.hash_types),
        };
        cfg.hash(p).map(|r| r.value)
    }

    /// The indirection table in effect; `created` lists existing RX queues
    /// in id order (used by the default table).
    pub fn table(&self, created: &[u32]) -> Vec<u32> {
        match &self.lut {
            Some(l) => l.clone(),
            None if created.is_empty() => vec![0; LUT_SIZE],
            None => (0..LUT_SIZE).map(|i| created[i % created.len()]).collect(),
        }
    }

    /// Takes the table CONFIGURE_RSS wrote; `created` lists the RX queues
    /// that exist, in id order. A table equal to the default spread over
    /// them (`ethtool_rxfh_indir_default`: what `ethtool -X default` writes)
    /// becomes the default again rather than a fixed table: with the
    /// RSS_CONFIG option the driver never rewrites the table when
    /// `ethtool -L` changes the queue count (it leaves that to the device,
    /// `gve_set_channels` resets RSS only for its own cached config), and
    /// the kernel lets the count shrink under a table it considers default
    /// (`ethtool_check_max_channel`). A fixed copy would then send flows to
    /// queues that are gone, where they are dropped. Any other table stays
    /// as written (the kernel keeps the queue count above its entries).
    /// Returns whether the table was taken as the default.
    pub fn set_table(&mut self, lut: Vec<u32>, created: &[u32]) -> bool {
        let is_default = !created.is_empty()
            && lut
                .iter()
                .enumerate()
                .all(|(i, &q)| q == created[i % created.len()]);
        self.lut = (!is_default).then_some(lut);
        is_default
    }

    /// The queue for a hash.
    pub fn queue(&self, hash: u32, created: &[u32]) -> u32 {
        let i = hash as usize % LUT_SIZE;
        match &self.lut {
            Some(l) => l.get(i).copied().unwrap_or(0),
            None if created.is_empty() => 0,
            None => created[i % created.len()],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gve_bits_map_to_virtio_bits() {
        assert_eq!(
            to_virtio(gve_hash::DEFAULT),
            hash_types::TCPV4 | hash_types::UDPV4 | hash_types::TCPV6 | hash_types::UDPV6
        );
        assert_eq!(to_virtio(gve_hash::ALL), hash_types::ALL);
    }

    #[test]
    fn default_table_spreads_over_created_queues() {
        let r = Rss::default();
        let t = r.table(&[0, 2]);
        assert_eq!(&t[..4], &[0, 2, 0, 2]);
        assert_eq!(r.queue(129, &[0, 2]), 2);
        assert_eq!(r.queue(5, &[]), 0);
    }

    #[test]
    fn a_written_default_table_follows_the_queues() {
        let mut r = Rss::default();
        let default4: Vec<u32> = (0..LUT_SIZE as u32).map(|i| i % 4).collect();
        assert!(r.set_table(default4.clone(), &[0, 1, 2, 3]));
        assert_eq!(r.table(&[0]), vec![0; LUT_SIZE]);
        // Not the default for the queues that exist: kept as written.
        assert!(!r.set_table(default4.clone(), &[0, 1]));
        assert_eq!(r.table(&[0]), default4);
        // No queue to compare with: kept.
        assert!(!r.set_table(vec![0; LUT_SIZE], &[]));
        assert!(r.lut.is_some());
    }
}
