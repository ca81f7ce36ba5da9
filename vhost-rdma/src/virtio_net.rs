//! virtio-net device definitions: feature sets, the per-frame header, and the
//! config space the daemon serves when it owns the whole device.

use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_net::*;
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};

/// Size of `struct virtio_net_hdr_mrg_rxbuf`: with VERSION_1 every frame carries
/// it, whether or not MRG_RXBUF was negotiated.
pub const NET_HDR_LEN: usize = 12;

/// Size of `struct virtio_net_hdr_v1_hash`: the header on both TX and RX once
/// VIRTIO_NET_F_HASH_REPORT is negotiated (`hash_value` le32 at 12,
/// `hash_report` le16 at 16, padding le16 at 18).
pub const NET_HDR_HASH_LEN: usize = 20;

/// The virtio-net header length for a negotiated feature set.
pub fn net_hdr_len(features: u64) -> usize {
    if features & bit(VIRTIO_NET_F_HASH_REPORT) != 0 {
        NET_HDR_HASH_LEN
    } else {
        NET_HDR_LEN
    }
}

/// `rss_max_key_size` served in the config space.
pub const RSS_MAX_KEY_SIZE: u8 = 40;
/// `rss_max_indirection_table_length` served in the config space.
pub const RSS_MAX_INDIRECTION_TABLE_LEN: u16 = 128;
/// `supported_hash_types`: every `VIRTIO_NET_RSS_HASH_TYPE_*` (devmem-nic
/// implements all nine).
pub const RSS_SUPPORTED_HASH_TYPES: u32 = (1 << 9) - 1;

/// Largest frame (without virtio-net header) we accept from a guest: a 64 KiB
/// GSO packet plus Ethernet and VLAN headers.
pub const MAX_FRAME_LEN: usize = 65535 + 14 + 4;

/// Smallest frame we accept: an Ethernet header.
pub const MIN_FRAME_LEN: usize = 14;

/// `1 << bit` as u64.
pub const fn bit(b: u32) -> u64 {
    1u64 << b
}

/// Feature bits offered in both device forms.
pub const BASE_FEATURES: u64 = bit(VIRTIO_F_VERSION_1)
    | bit(VIRTIO_RING_F_EVENT_IDX)
    | bit(VIRTIO_RING_F_INDIRECT_DESC)
    | bit(VIRTIO_NET_F_MAC)
    | bit(VIRTIO_NET_F_STATUS)
    | bit(VIRTIO_NET_F_MRG_RXBUF)
    | bit(VIRTIO_NET_F_CSUM)
    | bit(VIRTIO_NET_F_GUEST_CSUM)
    | bit(VIRTIO_NET_F_HOST_TSO4)
    | bit(VIRTIO_NET_F_HOST_TSO6)
    | bit(VIRTIO_NET_F_HOST_ECN)
    | bit(VIRTIO_NET_F_GUEST_TSO4)
    | bit(VIRTIO_NET_F_GUEST_TSO6)
    | bit(VIRTIO_NET_F_GUEST_ECN);

/// Extra bits offered when the daemon owns the device (test-device form): the
/// control queue and what it carries.
pub const OWNED_DEVICE_FEATURES: u64 = bit(VIRTIO_NET_F_CTRL_VQ)
    | bit(VIRTIO_NET_F_CTRL_RX)
    | bit(VIRTIO_NET_F_CTRL_VLAN)
    | bit(VIRTIO_NET_F_CTRL_MAC_ADDR)
    | bit(VIRTIO_NET_F_CTRL_GUEST_OFFLOADS)
    | bit(VIRTIO_NET_F_MTU)
    | bit(VIRTIO_NET_F_SPEED_DUPLEX)
    | bit(VIRTIO_NET_F_RSS)
    | bit(VIRTIO_NET_F_HASH_REPORT);

/// Flags and offload fields of a virtio-net header (the part that describes the
/// frame; `num_buffers` is an RX-side detail of the port).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
    /// RX only, with HASH_REPORT: the steering hash for this frame's
    /// receiver (set by the fabric; never read from a TX header).
    pub hash_value: u32,
    /// RX only, with HASH_REPORT: `VIRTIO_NET_HASH_REPORT_*`.
    pub hash_report: u16,
}

impl NetHdr {
    /// Parses the first [`NET_HDR_LEN`] bytes (little-endian, VERSION_1).
    pub fn parse(b: &[u8; NET_HDR_LEN]) -> Self {
        let le = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        NetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: le(2),
            gso_size: le(4),
            csum_start: le(6),
            csum_offset: le(8),
            ..NetHdr::default()
        }
    }

    /// Serialises with the given `num_buffers`.
    pub fn to_bytes(&self, num_buffers: u16) -> [u8; NET_HDR_LEN] {
        let mut b = [0u8; NET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
        b[10..12].copy_from_slice(&num_buffers.to_le_bytes());
        b
    }

    /// Serialises as `struct virtio_net_hdr_v1_hash` (HASH_REPORT negotiated).
    pub fn to_hash_bytes(&self, num_buffers: u16) -> [u8; NET_HDR_HASH_LEN] {
        let mut b = [0u8; NET_HDR_HASH_LEN];
        b[..NET_HDR_LEN].copy_from_slice(&self.to_bytes(num_buffers));
        b[12..16].copy_from_slice(&self.hash_value.to_le_bytes());
        b[16..18].copy_from_slice(&self.hash_report.to_le_bytes());
        b
    }

    /// Whether the checksum still has to be finished.
    pub fn needs_csum(&self) -> bool {
        self.flags & VIRTIO_NET_HDR_F_NEEDS_CSUM as u8 != 0
    }

    /// GSO type without the ECN bit.
    pub fn gso_kind(&self) -> u8 {
        self.gso_type & !(VIRTIO_NET_HDR_GSO_ECN as u8)
    }

    /// Whether the ECN bit of the GSO type is set.
    pub fn gso_ecn(&self) -> bool {
        self.gso_type & VIRTIO_NET_HDR_GSO_ECN as u8 != 0
    }
}

/// Size of the config space served in the test-device form (through
/// `supported_hash_types`).
pub const CONFIG_SPACE_LEN: usize = 24;

/// Builds `struct virtio_net_config` for the test-device form.
pub fn config_space(
    mac: [u8; 6],
    link_up: bool,
    max_queue_pairs: u16,
    mtu: u16,
) -> [u8; CONFIG_SPACE_LEN] {
    let mut c = [0u8; CONFIG_SPACE_LEN];
    c[0..6].copy_from_slice(&mac);
    let status: u16 = if link_up {
        VIRTIO_NET_S_LINK_UP as u16
    } else {
        0
    };
    c[6..8].copy_from_slice(&status.to_le_bytes());
    c[8..10].copy_from_slice(&max_queue_pairs.to_le_bytes());
    c[10..12].copy_from_slice(&mtu.to_le_bytes());
    // speed in Mbit/s, duplex full
    c[12..16].copy_from_slice(&100_000u32.to_le_bytes());
    c[16] = 1;
    // RSS / hash report limits (meaningful with VIRTIO_NET_F_RSS or
    // VIRTIO_NET_F_HASH_REPORT, which only this form offers)
    c[17] = RSS_MAX_KEY_SIZE;
    c[18..20].copy_from_slice(&RSS_MAX_INDIRECTION_TABLE_LEN.to_le_bytes());
    c[20..24].copy_from_slice(&RSS_SUPPORTED_HASH_TYPES.to_le_bytes());
    c
}
