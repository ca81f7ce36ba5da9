//! DESCRIBE_DEVICE's answer (`struct gve_device_descriptor` + options) and
//! GET_PTYPE_MAP's table.
//!
//! `gve_process_device_options` takes an option only if its length is at
//! least the struct size and `required_features_mask` is 0; features inside
//! options are then enabled only if the *queue-format* option's
//! `supported_features_mask` has their `GVE_SUP_*` bit
//! (`gve_enable_supported_features`), so the DQO_RDA option carries them.

use crate::rss;
use crate::GveConfig;

/// `GVE_ADMINQ_DEVICE_DESCRIPTOR_VERSION`.
pub const DESCRIPTOR_VERSION: u32 = 1;
/// `sizeof(struct gve_device_descriptor)`.
pub const DESCRIPTOR_LEN: usize = 40;

/// `GVE_DEV_OPT_ID_*`.
pub mod opt {
    /// DQO with raw DMA addressing.
    pub const DQO_RDA: u16 = 0x4;
    /// Ring size limits.
    pub const MODIFY_RING: u16 = 0x6;
    /// RX buffer and header buffer sizes.
    pub const BUFFER_SIZES: u16 = 0xa;
    /// ntuple rules.
    pub const FLOW_STEERING: u16 = 0xb;
    /// RSS key / table sizes.
    pub const RSS_CONFIG: u16 = 0xe;
    /// NIC timestamps (`GVE_DEV_OPT_ID_NIC_TIMESTAMP`).
    pub const NIC_TIMESTAMP: u16 = 0xd;
}

/// `GVE_SUP_*_MASK`.
pub mod sup {
    /// MODIFY_RING.
    pub const MODIFY_RING: u32 = 1 << 0;
    /// BUFFER_SIZES.
    pub const BUFFER_SIZES: u32 = 1 << 4;
    /// FLOW_STEERING.
    pub const FLOW_STEERING: u32 = 1 << 5;
    /// RSS_CONFIG.
    pub const RSS_CONFIG: u32 = 1 << 7;
    /// NIC_TIMESTAMP.
    pub const NIC_TIMESTAMP: u32 = 1 << 8;
}

fn option(out: &mut Vec<u8>, id: u16, body: &[u8]) {
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&(body.len() as u16).to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes()); // required_features_mask
    out.extend_from_slice(body);
}

/// The descriptor and its options, as written to guest memory.
pub fn device_descriptor(cfg: &GveConfig) -> Vec<u8> {
    let mut opts = Vec::new();
    let mut n = 0u16;
    let mut features = sup::BUFFER_SIZES | sup::MODIFY_RING;
    if cfg.max_flow_rules > 0 {
        features |= sup::FLOW_STEERING;
    }
    if cfg.rss_option {
        features |= sup::RSS_CONFIG;
    }
    if cfg.nic_timestamp {
        features |= sup::NIC_TIMESTAMP;
    }
    let mut body = Vec::new();
    body.extend_from_slice(&features.to_be_bytes());
    body.extend_from_slice(&0u32.to_be_bytes());
    option(&mut opts, opt::DQO_RDA, &body);
    n += 1;

    let mut body = Vec::new();
    body.extend_from_slice(&sup::BUFFER_SIZES.to_be_bytes());
    body.extend_from_slice(&cfg.packet_buffer_size.to_be_bytes());
    body.extend_from_slice(&cfg.header_buffer_size.to_be_bytes());
    option(&mut opts, opt::BUFFER_SIZES, &body);
    n += 1;

    let mut body = Vec::new();
    body.extend_from_slice(&sup::MODIFY_RING.to_be_bytes());
    for v in [
        cfg.max_ring_size,
        cfg.max_ring_size,
        cfg.min_ring_size,
        cfg.min_ring_size,
    ] {
        body.extend_from_slice(&v.to_be_bytes());
    }
    option(&mut opts, opt::MODIFY_RING, &body);
    n += 1;

    if cfg.max_flow_rules > 0 {
        let mut body = Vec::new();
        body.extend_from_slice(&sup::FLOW_STEERING.to_be_bytes());
        body.extend_from_slice(&0u32.to_be_bytes());
        body.extend_from_slice(&cfg.max_flow_rules.to_be_bytes());
        option(&mut opts, opt::FLOW_STEERING, &body);
        n += 1;
    }
    if cfg.rss_option {
        let mut body = Vec::new();
        body.extend_from_slice(&sup::RSS_CONFIG.to_be_bytes());
        body.extend_from_slice(&(rss::KEY_SIZE as u16).to_be_bytes());
        body.extend_from_slice(&(rss::LUT_SIZE as u16).to_be_bytes());
        option(&mut opts, opt::RSS_CONFIG, &body);
        n += 1;
    }
    if cfg.nic_timestamp {
        // `struct gve_device_option_nic_timestamp`: the driver then reads
        // the clock with REPORT_NIC_TIMESTAMP (every 250 ms) and registers
        // a PTP clock (`gve_init_clock`), so RX hardware timestamps work.
        option(
            &mut opts,
            opt::NIC_TIMESTAMP,
            &sup::NIC_TIMESTAMP.to_be_bytes(),
        );
        n += 1;
    }

    let total = (DESCRIPTOR_LEN + opts.len()) as u16;
    let mut d = Vec::with_capacity(usize::from(total));
    d.extend_from_slice(&cfg.max_registered_pages.to_be_bytes());
    d.extend_from_slice(&0u16.to_be_bytes()); // reserved1
    d.extend_from_slice(&cfg.tx_ring_size.to_be_bytes());
    d.extend_from_slice(&cfg.rx_ring_size.to_be_bytes());
    d.extend_from_slice(&cfg.default_num_queues.to_be_bytes());
    d.extend_from_slice(&cfg.mtu.to_be_bytes());
    d.extend_from_slice(&cfg.event_counters.to_be_bytes());
    d.extend_from_slice(&0u16.to_be_bytes()); // tx_pages_per_qpl
    d.extend_from_slice(&0u16.to_be_bytes()); // rx_pages_per_qpl
    d.extend_from_slice(&cfg.mac);
    d.extend_from_slice(&n.to_be_bytes());
    d.extend_from_slice(&total.to_be_bytes());
    d.extend_from_slice(&[0; 6]);
    d.extend_from_slice(&opts);
    d
}

/// `GVE_NUM_PTYPES`.
pub const NUM_PTYPES: usize = 1024;

/// `enum gve_l3_type`.
pub mod l3 {
    /// Unknown / not IP.
    pub const UNKNOWN: u8 = 0;
    /// Other.
    pub const OTHER: u8 = 1;
    /// IPv4.
    pub const IPV4: u8 = 2;
    /// IPv6.
    pub const IPV6: u8 = 3;
}

/// `enum gve_l4_type`.
pub mod l4 {
    /// Unknown (fragments, non-IP).
    pub const UNKNOWN: u8 = 0;
    /// Other IP protocol.
    pub const OTHER: u8 = 1;
    /// TCP.
    pub const TCP: u8 = 2;
    /// UDP.
    pub const UDP: u8 = 3;
    /// ICMP / ICMPv6.
    pub const ICMP: u8 = 4;
    /// SCTP.
    pub const SCTP: u8 = 5;
}

/// The model's packet type numbering: `l3 << 3 | l4`.
pub fn ptype(l3: u8, l4: u8) -> u16 {
    (u16::from(l3) << 3) | u16::from(l4)
}

/// The ptype map (`struct gve_ptype_map`: 1024 `{l3_type, l4_type}` pairs)
/// matching [`ptype`].
pub fn ptype_map() -> Vec<u8> {
    let mut m = vec![0u8; NUM_PTYPES * 2];
    for l3 in 0..=l3::IPV6 {
        for l4 in 0..=l4::SCTP {
            let i = usize::from(ptype(l3, l4));
            m[2 * i] = l3;
            m[2 * i + 1] = l4;
        }
    }
    m
}
