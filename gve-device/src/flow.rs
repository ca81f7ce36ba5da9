//! ntuple flow rules (`gve_flow_rule.c`, `struct gve_adminq_flow_rule`).
//!
//! A rule is a flow type (TCP/UDP/SCTP/AH/ESP over IPv4/IPv6), a key and a
//! mask over source/destination address, ports (or SPI) and TOS/traffic
//! class, all in network byte order as ethtool gives them, and a target RX
//! queue. Rules live at a location below `max_flow_rules`; the lowest
//! matching location wins, as with ethtool's rule locations. The layout is
//! gve's own, so the matcher is here rather than `devmem_nic::steering`
//! (which has no SPI/SCTP/TOS fields); frames are parsed by
//! `wire::parse`.

use std::collections::BTreeMap;

use wire::parse::{ParsedFrame, L3};

/// Size of `struct gve_flow_spec`.
pub const SPEC_LEN: usize = 40;
/// Size of `struct gve_adminq_flow_rule`.
pub const RULE_LEN: usize = 4 + 2 * SPEC_LEN;
/// Size of `struct gve_adminq_configure_flow_rule`.
pub const CFG_LEN: usize = 4 + RULE_LEN + 4;
/// Size of `struct gve_adminq_queried_flow_rule`.
pub const QUERIED_LEN: usize = 4 + RULE_LEN;

/// `struct gve_flow_spec`, raw network-order fields.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowSpec {
    /// Source address (IPv4 in the first 4 bytes).
    pub src_ip: [u8; 16],
    /// Destination address.
    pub dst_ip: [u8; 16],
    /// Source and destination port, or the SPI for AH/ESP.
    pub l4: [u8; 4],
    /// TOS / traffic class.
    pub tos: u8,
}

impl FlowSpec {
    fn decode(b: &[u8]) -> Self {
        let mut s = FlowSpec::default();
        s.src_ip.copy_from_slice(&b[0..16]);
        s.dst_ip.copy_from_slice(&b[16..32]);
        s.l4.copy_from_slice(&b[32..36]);
        s.tos = b[36];
        s
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.src_ip);
        out.extend_from_slice(&self.dst_ip);
        out.extend_from_slice(&self.l4);
        out.extend_from_slice(&[self.tos, 0, 0, 0]);
    }
}

/// `enum gve_adminq_flow_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowType {
    /// TCP over IPv4.
    TcpV4 = 0,
    /// UDP over IPv4.
    UdpV4,
    /// SCTP over IPv4.
    SctpV4,
    /// AH over IPv4.
    AhV4,
    /// ESP over IPv4.
    EspV4,
    /// TCP over IPv6.
    TcpV6,
    /// UDP over IPv6.
    UdpV6,
    /// SCTP over IPv6.
    SctpV6,
    /// AH over IPv6.
    AhV6,
    /// ESP over IPv6.
    EspV6,
}

impl FlowType {
    fn from_u16(v: u16) -> Option<Self> {
        use FlowType::*;
        [
            TcpV4, UdpV4, SctpV4, AhV4, EspV4, TcpV6, UdpV6, SctpV6, AhV6, EspV6,
        ]
        .get(usize::from(v))
        .copied()
    }

    fn v6(self) -> bool {
        self as u16 >= FlowType::TcpV6 as u16
    }

    fn proto(self) -> u8 {
        use FlowType::*;
        match self {
            TcpV4 | TcpV6 => 6,
            UdpV4 | UdpV6 => 17,
            SctpV4 | SctpV6 => 132,
            AhV4 | AhV6 => 51,
            EspV4 | EspV6 => 50,
        }
    }

    /// Offset of the 4 matched L4 bytes from the L4 header start.
    fn l4_field(self) -> usize {
        match self {
            FlowType::AhV4 | FlowType::AhV6 => 4,
            _ => 0,
        }
    }
}

/// An installed rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowRule {
    /// Flow type.
    pub flow_type: FlowType,
    /// Target RX queue (`action`).
    pub queue: u16,
    /// Key.
    pub key: FlowSpec,
    /// Mask.
    pub mask: FlowSpec,
    /// Frames steered.
    pub hits: u64,
}

/// Why a rule was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// Unknown `flow_type`.
    #[error("unknown flow type {0}")]
    BadFlowType(u16),
}

impl FlowRule {
    /// Decodes `struct gve_adminq_flow_rule` (84 bytes).
    pub fn decode(b: &[u8; RULE_LEN]) -> Result<Self, RuleError> {
        let ft = u16::from_be_bytes([b[0], b[1]]);
        let flow_type = FlowType::from_u16(ft).ok_or(RuleError::BadFlowType(ft))?;
        Ok(FlowRule {
            flow_type,
            queue: u16::from_be_bytes([b[2], b[3]]),
            key: FlowSpec::decode(&b[4..4 + SPEC_LEN]),
            mask: FlowSpec::decode(&b[4 + SPEC_LEN..RULE_LEN]),
            hits: 0,
        })
    }

    /// Encodes it back (for QUERY_FLOW_RULES).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.flow_type as u16).to_be_bytes());
        out.extend_from_slice(&self.queue.to_be_bytes());
        self.key.encode(out);
        self.mask.encode(out);
    }

    /// True if the frame matches.
    pub fn matches(&self, frame: &[u8], p: &ParsedFrame) -> bool {
        let Some(l3) = p.l3 else {
            return false;
        };
        if l3.protocol() != self.flow_type.proto() || l3.is_fragment() {
            return false;
        }
        let masked_eq = |a: &[u8], k: &[u8], m: &[u8]| {
            a.iter()
                .zip(k.iter().zip(m))
                .all(|(a, (k, m))| a & m == k & m)
        };
        let Some(ip) = frame.get(p.l3_offset..) else {
            return false;
        };
        let (ip_ok, tos) = match l3 {
            L3::V4(v4) if !self.flow_type.v6() => (
                masked_eq(
                    &v4.src.octets(),
                    &self.key.src_ip[..4],
                    &self.mask.src_ip[..4],
                ) && masked_eq(
                    &v4.dst.octets(),
                    &self.key.dst_ip[..4],
                    &self.mask.dst_ip[..4],
                ),
                ip.get(1).copied().unwrap_or(0),
            ),
            L3::V6(v6) if self.flow_type.v6() => (
                masked_eq(&v6.src.octets(), &self.key.src_ip, &self.mask.src_ip)
                    && masked_eq(&v6.dst.octets(), &self.key.dst_ip, &self.mask.dst_ip),
                match (ip.first(), ip.get(1)) {
                    (Some(a), Some(b)) => (a << 4) | (b >> 4),
                    _ => 0,
                },
            ),
            _ => return false,
        };
        if !ip_ok || (tos & self.mask.tos) != (self.key.tos & self.mask.tos) {
            return false;
        }
        let at = p.l3_offset + l3.header_len() + self.flow_type.l4_field();
        match frame.get(at..at + 4) {
            Some(f) => masked_eq(f, &self.key.l4, &self.mask.l4),
            // A frame too short for the L4 field matches only a rule that
            // does not look at it.
            None => self.mask.l4 == [0; 4],
        }
    }

    /// One line for `ctl status`.
    pub fn describe(&self) -> String {
        let fmt_ip = |a: &[u8; 16], m: &[u8; 16]| -> String {
            if self.flow_type.v6() {
                format!(
                    "{}/{}",
                    std::net::Ipv6Addr::from(*a),
                    std::net::Ipv6Addr::from(*m)
                )
            } else {
                format!(
                    "{}/{}",
                    std::net::Ipv4Addr::new(a[0], a[1], a[2], a[3]),
                    std::net::Ipv4Addr::new(m[0], m[1], m[2], m[3])
                )
            }
        };
        format!(
            "{:?} src {} dst {} l4 {:02x?}/{:02x?}",
            self.flow_type,
            fmt_ip(&self.key.src_ip, &self.mask.src_ip),
            fmt_ip(&self.key.dst_ip, &self.mask.dst_ip),
            self.key.l4,
            self.mask.l4
        )
    }
}

/// The rule table, by location.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlowRules {
    /// Rules by location.
    pub rules: BTreeMap<u32, FlowRule>,
}

impl FlowRules {
    /// The first (lowest location) rule matching the frame.
    pub fn lookup(&mut self, frame: &[u8], p: &ParsedFrame) -> Option<&mut FlowRule> {
        self.rules.values_mut().find(|r| r.matches(frame, p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::builder::FrameBuilder;
    use wire::parse::parse;

    fn rule(ft: FlowType, dport: u16, mask: u16) -> FlowRule {
        let mut key = FlowSpec::default();
        let mut m = FlowSpec::default();
        key.l4[2..4].copy_from_slice(&dport.to_be_bytes());
        m.l4[2..4].copy_from_slice(&mask.to_be_bytes());
        FlowRule {
            flow_type: ft,
            queue: 1,
            key,
            mask: m,
            hits: 0,
        }
    }

    #[test]
    fn matches_type_and_masked_ports() {
        let a = "10.0.0.1".parse().unwrap();
        let b = "10.0.0.2".parse().unwrap();
        let f = FrameBuilder::tcp(a, 1, b, 5201).build(b"x");
        let p = parse(&f);
        assert!(rule(FlowType::TcpV4, 5201, 0xffff).matches(&f, &p));
        assert!(!rule(FlowType::TcpV4, 5202, 0xffff).matches(&f, &p));
        assert!(rule(FlowType::TcpV4, 5200, 0xfff0).matches(&f, &p));
        assert!(!rule(FlowType::UdpV4, 5201, 0xffff).matches(&f, &p));
        assert!(!rule(FlowType::TcpV6, 5201, 0xffff).matches(&f, &p));
    }

    #[test]
    fn encode_decode_round_trip() {
        let r = rule(FlowType::EspV6, 7, 0xffff);
        let mut b = Vec::new();
        r.encode(&mut b);
        let raw: [u8; RULE_LEN] = b.try_into().unwrap();
        assert_eq!(FlowRule::decode(&raw).unwrap(), r);
        let mut bad = raw;
        bad[1] = 10;
        assert_eq!(FlowRule::decode(&bad), Err(RuleError::BadFlowType(10)));
    }
}
