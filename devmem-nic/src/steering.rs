//! Flow-steering rules (ethtool ntuple / the virtio-net flow filter): match
//! on L2/L3/L4 fields with masks, act with `Queue(n)` or `Drop`, lower
//! priority number first, ties broken by insertion order.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::error::NicError;
use wire::parse::{ParsedFrame, L3};

/// A value compared under a mask: a field matches when
/// `field & mask == value & mask`. A zero mask matches any value of a field
/// that is present (the field's layer must still exist).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Masked<T> {
    /// The value to compare with.
    pub value: T,
    /// The bits that take part.
    pub mask: T,
}

/// A field type usable in [`Masked`].
pub trait Maskable: Copy {
    /// The all-ones mask (exact match).
    const ALL_ONES: Self;
    /// True if `a & mask == b & mask`.
    fn eq_under(a: Self, b: Self, mask: Self) -> bool;
}

impl Maskable for u16 {
    const ALL_ONES: Self = u16::MAX;
    fn eq_under(a: Self, b: Self, mask: Self) -> bool {
        a & mask == b & mask
    }
}

impl Maskable for [u8; 6] {
    const ALL_ONES: Self = [0xff; 6];
    fn eq_under(a: Self, b: Self, mask: Self) -> bool {
        (0..6).all(|i| a[i] & mask[i] == b[i] & mask[i])
    }
}

impl<T: Maskable> Masked<T> {
    /// Exact match (all-ones mask).
    pub fn exact(value: T) -> Self {
        Masked {
            value,
            mask: T::ALL_ONES,
        }
    }

    /// True if `field` matches.
    pub fn matches(&self, field: T) -> bool {
        T::eq_under(field, self.value, self.mask)
    }
}

/// An IP address match with a mask; an IPv4 match never matches IPv6 and
/// vice versa.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpMatch {
    /// IPv4 address and mask.
    V4 {
        /// Address.
        addr: Ipv4Addr,
        /// Mask (need not be contiguous).
        mask: Ipv4Addr,
    },
    /// IPv6 address and mask.
    V6 {
        /// Address.
        addr: Ipv6Addr,
        /// Mask (need not be contiguous).
        mask: Ipv6Addr,
    },
}

impl IpMatch {
    /// IPv4 prefix match (`prefix_len` is clamped to 32).
    pub fn v4_prefix(addr: Ipv4Addr, prefix_len: u8) -> Self {
        let bits = u32::from(prefix_len.min(32));
        let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
        IpMatch::V4 {
            addr,
            mask: Ipv4Addr::from(mask),
        }
    }

    /// IPv6 prefix match (`prefix_len` is clamped to 128).
    pub fn v6_prefix(addr: Ipv6Addr, prefix_len: u8) -> Self {
        let bits = u32::from(prefix_len.min(128));
        let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
        IpMatch::V6 {
            addr,
            mask: Ipv6Addr::from(mask),
        }
    }

    /// Exact IPv4 match.
    pub fn v4(addr: Ipv4Addr) -> Self {
        Self::v4_prefix(addr, 32)
    }

    /// Exact IPv6 match.
    pub fn v6(addr: Ipv6Addr) -> Self {
        Self::v6_prefix(addr, 128)
    }

    fn matches_v4(&self, field: Ipv4Addr) -> bool {
        match *self {
            IpMatch::V4 { addr, mask } => {
                let m = u32::from(mask);
                u32::from(field) & m == u32::from(addr) & m
            }
            IpMatch::V6 { .. } => false,
        }
    }

    fn matches_v6(&self, field: Ipv6Addr) -> bool {
        match *self {
            IpMatch::V6 { addr, mask } => {
                let m = u128::from(mask);
                u128::from(field) & m == u128::from(addr) & m
            }
            IpMatch::V4 { .. } => false,
        }
    }
}

/// What a rule matches. Every `Some` field must match; `None` is a wildcard.
///
/// * `ethertype` is compared with the ethertype after the (optional) VLAN tag.
/// * Any L3 field requires an IP packet of that family; `ip_proto` is the
///   upper-layer protocol (after IPv6 extension headers).
/// * Port fields require a TCP or UDP header, so they never match IP
///   fragments (which carry no ports) nor other protocols. Set `ip_proto` to
///   restrict to TCP (6) or UDP (17).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlowMatch {
    /// Destination MAC.
    pub dst_mac: Option<Masked<[u8; 6]>>,
    /// Source MAC.
    pub src_mac: Option<Masked<[u8; 6]>>,
    /// Ethertype (exact).
    pub ethertype: Option<u16>,
    /// Source IP.
    pub src_ip: Option<IpMatch>,
    /// Destination IP.
    pub dst_ip: Option<IpMatch>,
    /// IP protocol / IPv6 upper-layer next header (exact).
    pub ip_proto: Option<u8>,
    /// TCP/UDP source port.
    pub src_port: Option<Masked<u16>>,
    /// TCP/UDP destination port.
    pub dst_port: Option<Masked<u16>>,
}

impl FlowMatch {
    /// True if the parsed frame satisfies every field of this match.
    pub fn matches(&self, p: &ParsedFrame) -> bool {
        let needs_l2 = self.dst_mac.is_some() || self.src_mac.is_some() || self.ethertype.is_some();
        if needs_l2 {
            let Some(l2) = p.l2 else { return false };
            if !self.dst_mac.is_none_or(|m| m.matches(l2.dst))
                || !self.src_mac.is_none_or(|m| m.matches(l2.src))
                || self.ethertype.is_some_and(|t| t != l2.ethertype)
            {
                return false;
            }
        }
        let needs_l3 = self.src_ip.is_some() || self.dst_ip.is_some() || self.ip_proto.is_some();
        if needs_l3 {
            let Some(l3) = p.l3 else { return false };
            let (src_ok, dst_ok) = match l3 {
                L3::V4(ip) => (
                    self.src_ip.is_none_or(|m| m.matches_v4(ip.src)),
                    self.dst_ip.is_none_or(|m| m.matches_v4(ip.dst)),
                ),
                L3::V6(ip) => (
                    self.src_ip.is_none_or(|m| m.matches_v6(ip.src)),
                    self.dst_ip.is_none_or(|m| m.matches_v6(ip.dst)),
                ),
            };
            if !src_ok || !dst_ok || self.ip_proto.is_some_and(|pr| pr != l3.protocol()) {
                return false;
            }
        }
        if self.src_port.is_some() || self.dst_port.is_some() {
            let Some(l4) = p.l4 else { return false };
            if !self.src_port.is_none_or(|m| m.matches(l4.src_port))
                || !self.dst_port.is_none_or(|m| m.matches(l4.dst_port))
            {
                return false;
            }
        }
        true
    }
}

/// What to do with a matching frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Deliver to this receive queue (0-based).
    Queue(u16),
    /// Drop the frame (counted as a rule drop).
    Drop,
}

/// One steering rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowRule {
    /// Caller-chosen unique id (like the ethtool location / virtio rule id).
    pub id: u32,
    /// Lower numbers are tried first; equal priorities in insertion order.
    pub priority: u32,
    /// What the rule matches.
    pub matcher: FlowMatch,
    /// What it does.
    pub action: Action,
}

/// An ordered, bounded set of rules.
#[derive(Debug, Clone)]
pub struct RuleTable {
    /// Kept sorted by (priority, insertion sequence).
    rules: Vec<(u32, u64, FlowRule)>,
    max_rules: usize,
    next_seq: u64,
}

impl RuleTable {
    /// An empty table accepting at most `max_rules` rules.
    pub fn new(max_rules: usize) -> Self {
        RuleTable {
            rules: Vec::new(),
            max_rules,
            next_seq: 0,
        }
    }

    /// Maximum number of rules.
    pub fn max_rules(&self) -> usize {
        self.max_rules
    }

    /// Number of installed rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// True if no rules are installed.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Installs a rule. Fails if the id exists or the table is full. (Queue
    /// numbers are checked by [`Nic::add_rule`](crate::Nic::add_rule).)
    pub fn insert(&mut self, rule: FlowRule) -> Result<(), NicError> {
        if self.get(rule.id).is_some() {
            return Err(NicError::DuplicateRule(rule.id));
        }
        if self.rules.len() >= self.max_rules {
            return Err(NicError::RuleTableFull {
                max: self.max_rules,
            });
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let at = self
            .rules
            .partition_point(|(p, s, _)| (*p, *s) < (rule.priority, seq));
        self.rules.insert(at, (rule.priority, seq, rule));
        Ok(())
    }

    /// Removes and returns the rule with this id.
    pub fn remove(&mut self, id: u32) -> Result<FlowRule, NicError> {
        let at = self
            .rules
            .iter()
            .position(|(_, _, r)| r.id == id)
            .ok_or(NicError::NoSuchRule(id))?;
        Ok(self.rules.remove(at).2)
    }

    /// The rule with this id.
    pub fn get(&self, id: u32) -> Option<&FlowRule> {
        self.rules.iter().map(|(_, _, r)| r).find(|r| r.id == id)
    }

    /// Rules in evaluation order.
    pub fn iter(&self) -> impl Iterator<Item = &FlowRule> {
        self.rules.iter().map(|(_, _, r)| r)
    }

    /// The first rule (in evaluation order) matching the frame.
    pub fn lookup(&self, p: &ParsedFrame) -> Option<&FlowRule> {
        self.iter().find(|r| r.matcher.matches(p))
    }
}
