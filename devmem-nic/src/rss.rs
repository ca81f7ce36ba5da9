//! Receive-side scaling as virtio-net defines it (spec 1.4, 5.1.6.4.3 "Hash
//! calculation for incoming packets" and 5.1.6.5.7 "Receive-side scaling").

use crate::error::NicError;
use crate::toeplitz::{toeplitz_hash, DEFAULT_RSS_KEY};
use wire::parse::{L4Proto, ParsedFrame, L3};

/// `VIRTIO_NET_RSS_HASH_TYPE_*` bits of the `hash_types` bitmap.
pub mod hash_types {
    /// Source and destination IPv4 address.
    pub const IPV4: u32 = 1 << 0;
    /// IPv4 addresses and TCP ports.
    pub const TCPV4: u32 = 1 << 1;
    /// IPv4 addresses and UDP ports.
    pub const UDPV4: u32 = 1 << 2;
    /// Source and destination IPv6 address.
    pub const IPV6: u32 = 1 << 3;
    /// IPv6 addresses and TCP ports.
    pub const TCPV6: u32 = 1 << 4;
    /// IPv6 addresses and UDP ports.
    pub const UDPV6: u32 = 1 << 5;
    /// IPv6 home address / type 2 routing address (else src/dst).
    pub const IP_EX: u32 = 1 << 6;
    /// As `IP_EX` plus TCP ports.
    pub const TCP_EX: u32 = 1 << 7;
    /// As `IP_EX` plus UDP ports.
    pub const UDP_EX: u32 = 1 << 8;
    /// Every type above.
    pub const ALL: u32 = (1 << 9) - 1;
}

/// The `VIRTIO_NET_HASH_REPORT_*` value for the `hash_report` field of the
/// virtio-net header: which hash type produced `hash_value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum HashReport {
    /// No hash was calculated.
    None = 0,
    /// IPv4 2-tuple.
    Ipv4 = 1,
    /// TCPv4 4-tuple.
    Tcpv4 = 2,
    /// UDPv4 4-tuple.
    Udpv4 = 3,
    /// IPv6 2-tuple.
    Ipv6 = 4,
    /// TCPv6 4-tuple.
    Tcpv6 = 5,
    /// UDPv6 4-tuple.
    Udpv6 = 6,
    /// IPv6 2-tuple with extension-header addresses.
    Ipv6Ex = 7,
    /// TCPv6 4-tuple with extension-header addresses.
    Tcpv6Ex = 8,
    /// UDPv6 4-tuple with extension-header addresses.
    Udpv6Ex = 9,
}

impl HashReport {
    /// The numeric `VIRTIO_NET_HASH_REPORT_*` code.
    pub fn code(self) -> u16 {
        self as u16
    }

    /// The `VIRTIO_NET_RSS_HASH_TYPE_*` bit that selects this report (0 for
    /// `None`).
    pub fn hash_type_bit(self) -> u32 {
        match self {
            HashReport::None => 0,
            HashReport::Ipv4 => hash_types::IPV4,
            HashReport::Tcpv4 => hash_types::TCPV4,
            HashReport::Udpv4 => hash_types::UDPV4,
            HashReport::Ipv6 => hash_types::IPV6,
            HashReport::Tcpv6 => hash_types::TCPV6,
            HashReport::Udpv6 => hash_types::UDPV6,
            HashReport::Ipv6Ex => hash_types::IP_EX,
            HashReport::Tcpv6Ex => hash_types::TCP_EX,
            HashReport::Udpv6Ex => hash_types::UDP_EX,
        }
    }
}

/// Device limits advertised in the virtio-net config space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RssLimits {
    /// `rss_max_key_size` (the spec requires at least 40).
    pub max_key_size: usize,
    /// `rss_max_indirection_table_length`.
    pub max_indirection_table_len: usize,
    /// `supported_hash_types`.
    pub supported_hash_types: u32,
}

impl Default for RssLimits {
    fn default() -> Self {
        RssLimits {
            max_key_size: 40,
            max_indirection_table_len: 128,
            supported_hash_types: hash_types::ALL,
        }
    }
}

/// Hash key and enabled hash types (what `VIRTIO_NET_CTRL_MQ_HASH_CONFIG`
/// sets for hash reporting without RSS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashConfig {
    /// Toeplitz key.
    pub key: Vec<u8>,
    /// Enabled `VIRTIO_NET_RSS_HASH_TYPE_*` bits.
    pub hash_types: u32,
}

impl Default for HashConfig {
    /// The default 40-byte key with every hash type enabled.
    fn default() -> Self {
        HashConfig {
            key: DEFAULT_RSS_KEY.to_vec(),
            hash_types: hash_types::ALL,
        }
    }
}

/// The outcome of hashing one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashResult {
    /// The 32-bit Toeplitz hash (`hash_value` in the virtio-net header).
    pub value: u32,
    /// Which hash type produced it.
    pub report: HashReport,
}

impl HashConfig {
    /// Checks the key length and hash-type bits against `limits`.
    pub fn validate(&self, limits: &RssLimits) -> Result<(), NicError> {
        if self.key.len() > limits.max_key_size {
            return Err(NicError::KeyTooLong {
                len: self.key.len(),
                max: limits.max_key_size,
            });
        }
        let unsupported = self.hash_types & !limits.supported_hash_types;
        if unsupported != 0 {
            return Err(NicError::UnsupportedHashTypes(unsupported));
        }
        Ok(())
    }

    /// Hashes a parsed frame following virtio-net 5.1.6.4.3.
    ///
    /// * IPv4: TCPv4 if enabled and the packet has a TCP header, else UDPv4 if
    ///   enabled and it has a UDP header, else IPv4 if enabled, else none.
    ///   Fragments never have ports here (the parser reports no L4 for them),
    ///   so a fragment hashes as IPv4 only, as Microsoft's RSS rules require.
    /// * IPv6 with extension headers: TCP_EX, else UDP_EX, else IP_EX (each
    ///   if enabled and applicable), using the Home Address option instead of
    ///   the source and the type 2 Routing header address instead of the
    ///   destination when present; else the rules for IPv6 without extension
    ///   headers apply to the same packet.
    /// * IPv6 without extension headers: TCPv6, else UDPv6, else IPv6.
    ///
    /// Note: QEMU's software RSS (`virtio_net_get_hash_type` in
    /// `hw/net/virtio-net.c`) picks the `_EX` type whenever its bit is
    /// enabled, for IPv6 packets with or without extension headers (for
    /// example TCPv6 without extension headers and `TCP_EX` enabled reports
    /// `TCPv6_EX`). This model follows the spec text instead: the `_EX` rules
    /// apply only to packets that carry an extension header. The hash value
    /// is the same either way when no Home Address option or type 2 Routing
    /// header is present; only `hash_report`, and the unclassified case with
    /// only `_EX` bits enabled, differ.
    pub fn hash(&self, p: &ParsedFrame) -> Option<HashResult> {
        let t = self.hash_types;
        let ports = p.l4.map(|l4| (l4.proto, l4.src_port, l4.dst_port));
        let tcp = matches!(ports, Some((L4Proto::Tcp, _, _)));
        let udp = matches!(ports, Some((L4Proto::Udp, _, _)));
        let mut input = [0u8; 36];
        let (len, report) = match p.l3? {
            L3::V4(ip) => {
                input[0..4].copy_from_slice(&ip.src.octets());
                input[4..8].copy_from_slice(&ip.dst.octets());
                if tcp && t & hash_types::TCPV4 != 0 {
                    (12, HashReport::Tcpv4)
                } else if udp && t & hash_types::UDPV4 != 0 {
                    (12, HashReport::Udpv4)
                } else if t & hash_types::IPV4 != 0 {
                    (8, HashReport::Ipv4)
                } else {
                    return None;
                }
            }
            L3::V6(ip) => {
                let ex = if !ip.has_ext_headers {
                    None
                } else if tcp && t & hash_types::TCP_EX != 0 {
                    Some((36, HashReport::Tcpv6Ex))
                } else if udp && t & hash_types::UDP_EX != 0 {
                    Some((36, HashReport::Udpv6Ex))
                } else if t & hash_types::IP_EX != 0 {
                    Some((32, HashReport::Ipv6Ex))
                } else {
                    None
                };
                let (src, dst) = match ex {
                    Some(_) => (
                        ip.home_address.unwrap_or(ip.src),
                        ip.rt2_address.unwrap_or(ip.dst),
                    ),
                    None => (ip.src, ip.dst),
                };
                input[0..16].copy_from_slice(&src.octets());
                input[16..32].copy_from_slice(&dst.octets());
                match ex {
                    Some(e) => e,
                    None if tcp && t & hash_types::TCPV6 != 0 => (36, HashReport::Tcpv6),
                    None if udp && t & hash_types::UDPV6 != 0 => (36, HashReport::Udpv6),
                    None if t & hash_types::IPV6 != 0 => (32, HashReport::Ipv6),
                    None => return None,
                }
            }
        };
        if len > 32 || len == 12 {
            let (_, sp, dp) = ports?;
            let at = len - 4;
            input[at..at + 2].copy_from_slice(&sp.to_be_bytes());
            input[at + 2..at + 4].copy_from_slice(&dp.to_be_bytes());
        }
        Some(HashResult {
            value: toeplitz_hash(&self.key, &input[..len]),
            report,
        })
    }
}

/// RSS configuration: hash settings plus the indirection table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RssConfig {
    /// Key and enabled hash types.
    pub hash: HashConfig,
    /// Receive-queue index per bucket; the length is a power of two and the
    /// bucket is `hash & (len - 1)` (`indirection_table_mask`).
    pub indirection_table: Vec<u16>,
    /// Queue for packets for which no hash was calculated.
    pub unclassified_queue: u16,
}

impl RssConfig {
    /// Default key, every hash type, a 128-entry table spreading buckets
    /// round-robin over queues `0..num_queues` (like `ethtool -X equal N`),
    /// unclassified packets to queue 0.
    pub fn equal(num_queues: u16) -> Self {
        let n = num_queues.max(1);
        RssConfig {
            hash: HashConfig::default(),
            indirection_table: (0..128u16).map(|i| i % n).collect(),
            unclassified_queue: 0,
        }
    }

    /// The bucket (indirection-table index) for a hash value.
    pub fn bucket(&self, hash: u32) -> usize {
        let mask = self.indirection_table.len().saturating_sub(1);
        hash as usize & mask
    }

    /// Checks the configuration against the device limits and queue count.
    pub fn validate(&self, limits: &RssLimits, num_queues: u16) -> Result<(), NicError> {
        self.hash.validate(limits)?;
        let len = self.indirection_table.len();
        if len == 0 || !len.is_power_of_two() || len > limits.max_indirection_table_len {
            return Err(NicError::BadIndirectionTable {
                len,
                max: limits.max_indirection_table_len,
            });
        }
        let check = |queue: u16| {
            if queue >= num_queues {
                Err(NicError::NoSuchQueue { queue, num_queues })
            } else {
                Ok(())
            }
        };
        check(self.unclassified_queue)?;
        self.indirection_table.iter().try_for_each(|&q| check(q))
    }

    /// Parses `struct virtio_net_rss_config` (the `VIRTIO_NET_CTRL_MQ_RSS_CONFIG`
    /// command payload, little-endian):
    /// `le32 hash_types; le16 indirection_table_mask; le16 unclassified_queue;
    /// le16 indirection_table[mask + 1]; le16 max_tx_vq; u8 hash_key_length;
    /// u8 hash_key_data[hash_key_length]`.
    ///
    /// Queue numbers are 0-based receive-queue indices (0 = receiveq1).
    /// Returns the configuration and `max_tx_vq`. Limits are not checked here;
    /// call [`validate`](Self::validate).
    pub fn from_virtio_bytes(b: &[u8]) -> Result<(Self, u16), NicError> {
        let need = |n: usize| {
            if b.len() < n {
                Err(NicError::Truncated {
                    need: n,
                    have: b.len(),
                })
            } else {
                Ok(())
            }
        };
        let le16 = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        need(8)?;
        let hash_types = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let entries = usize::from(le16(4)) + 1;
        let unclassified_queue = le16(6);
        let key_at = 8 + entries * 2 + 2;
        need(key_at + 1)?;
        let indirection_table = (0..entries).map(|i| le16(8 + 2 * i)).collect();
        let max_tx_vq = le16(8 + entries * 2);
        let key_len = usize::from(b[key_at]);
        need(key_at + 1 + key_len)?;
        let key = b[key_at + 1..key_at + 1 + key_len].to_vec();
        Ok((
            RssConfig {
                hash: HashConfig { key, hash_types },
                indirection_table,
                unclassified_queue,
            },
            max_tx_vq,
        ))
    }
}

impl HashConfig {
    /// Parses `struct virtio_net_hash_config` (`VIRTIO_NET_CTRL_MQ_HASH_CONFIG`):
    /// `le32 hash_types; le16 reserved[4]; u8 hash_key_length;
    /// u8 hash_key_data[hash_key_length]`.
    pub fn from_virtio_bytes(b: &[u8]) -> Result<Self, NicError> {
        let truncated = |need| NicError::Truncated {
            need,
            have: b.len(),
        };
        let hdr = b.get(..13).ok_or_else(|| truncated(13))?;
        let hash_types = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
        let key_len = usize::from(hdr[12]);
        let key = b
            .get(13..13 + key_len)
            .ok_or_else(|| truncated(13 + key_len))?
            .to_vec();
        Ok(HashConfig { key, hash_types })
    }
}
