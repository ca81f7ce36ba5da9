//! The L2-L4 match fields, declared once: fault rules (`[[fault]]`,
//! `faults add`) and flow rules (`[[port.flow-rule]]`, `flow-rule add`)
//! embed [`MatchSpec`] (flattened, so the JSON and TOML spelling is the
//! fields themselves) and compile it into one matcher, devmem-nic's
//! [`FlowMatch`], which reads the parsed view of a frame
//! ([`FrameView`](crate::frame::FrameView)).
//!
//! Also the serde helper both rule types need: `deny_unknown_fields` does not
//! work together with `flatten`, so [`reject_unknown`] refuses leftover keys
//! with serde's own "unknown field" message.

use devmem_nic::{FlowMatch, IpMatch, Masked};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::{AddrParseError, IpAddr};
use std::num::ParseIntError;
use thiserror::Error;

/// Which frames a rule selects: every given field must match; none given
/// matches every frame. Names as the control socket and config files spell
/// them (kebab-case), and as `ctl faults add` and `ctl flow-rule add` take
/// them (`--src-mac`, ...).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
#[serde(rename_all = "kebab-case")]
pub struct MatchSpec {
    /// Source MAC, `aa:bb:cc:dd:ee:ff`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long, value_name = "MAC", help = "Source MAC address")]
    pub src_mac: Option<String>,
    /// Destination MAC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long, value_name = "MAC", help = "Destination MAC address")]
    pub dst_mac: Option<String>,
    /// Ethertype after the (one, optional) VLAN tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long, value_parser = parse_u16_any, help = "EtherType (decimal or 0x hex)")]
    pub ethertype: Option<u16>,
    /// `ADDR` or `ADDR/PREFIX` (IPv4 or IPv6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(
        long,
        value_name = "IP[/LEN]",
        help = "ADDR or ADDR/PREFIX (IPv4 or IPv6)"
    )]
    pub src_ip: Option<String>,
    /// `ADDR` or `ADDR/PREFIX` (IPv4 or IPv6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(
        long,
        value_name = "IP[/LEN]",
        help = "ADDR or ADDR/PREFIX (IPv4 or IPv6)"
    )]
    pub dst_ip: Option<String>,
    /// `tcp`, `udp` or an IP protocol number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long, help = "tcp, udp or a protocol number")]
    pub proto: Option<String>,
    /// TCP/UDP source port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long, help = "L4 source port")]
    pub src_port: Option<u16>,
    /// TCP/UDP destination port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long, help = "L4 destination port")]
    pub dst_port: Option<u16>,
}

macro_rules! parse_any {
    ($name:ident, $ty:ty) => {
        /// Decimal or 0x-prefixed hexadecimal (command-line numbers; clap
        /// prints the error after the argument it refused).
        pub fn $name(s: &str) -> Result<$ty, ParseIntError> {
            match s.strip_prefix("0x") {
                Some(h) => <$ty>::from_str_radix(h, 16),
                None => s.parse(),
            }
        }
    };
}
parse_any!(parse_u8_any, u8);
parse_any!(parse_u16_any, u16);
parse_any!(parse_u32_any, u32);

/// The serde names of [`MatchSpec`]'s fields, in declaration order (for the
/// field lists of the rule types that embed it).
pub const MATCH_FIELDS: [&str; 8] = [
    "src-mac",
    "dst-mac",
    "ethertype",
    "src-ip",
    "dst-ip",
    "proto",
    "src-port",
    "dst-port",
];

/// The key list of a rule type that embeds a [`MatchSpec`]: its own keys
/// `head`, then [`MATCH_FIELDS`], then its own keys `tail`. `N` is the
/// total; a wrong one fails the build.
pub(crate) const fn rule_fields<const N: usize>(
    head: &[&'static str],
    tail: &[&'static str],
) -> [&'static str; N] {
    assert!(head.len() + MATCH_FIELDS.len() + tail.len() == N);
    let mut out = [""; N];
    let mut at = 0;
    let mut i = 0;
    while i < head.len() {
        out[at] = head[i];
        at += 1;
        i += 1;
    }
    i = 0;
    while i < MATCH_FIELDS.len() {
        out[at] = MATCH_FIELDS[i];
        at += 1;
        i += 1;
    }
    i = 0;
    while i < tail.len() {
        out[at] = tail[i];
        at += 1;
        i += 1;
    }
    out
}

/// A match field that does not parse. The messages are what users see from
/// the control socket and config validation.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum MatchError {
    /// Not six colon-separated parts.
    #[error("MAC {0:?} must have six colon-separated hex bytes")]
    MacShape(String),
    /// A part that is not a hex byte.
    #[error("bad byte {byte:?} in MAC {mac:?}")]
    MacByte {
        /// The offending part.
        byte: String,
        /// The whole MAC as given.
        mac: String,
    },
    /// `ADDR/PREFIX` with a prefix that is not a number up to 255.
    #[error("bad prefix in {0:?}")]
    Prefix(String),
    /// Not an IP address.
    #[error("{0:?}: {1}")]
    Addr(String, AddrParseError),
    /// An IPv4 prefix above 32.
    #[error("{0:?}: IPv4 prefix above 32")]
    Ipv4Prefix(String),
    /// An IPv6 prefix above 128.
    #[error("{0:?}: IPv6 prefix above 128")]
    Ipv6Prefix(String),
    /// Neither `tcp`, `udp` nor a protocol number.
    #[error("protocol {0:?}: use tcp, udp or a number")]
    Proto(String),
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Result<[u8; 6], MatchError> {
    let parts: Vec<&str> = s.split(':').collect();
    let mut m = [0u8; 6];
    if parts.len() != 6 {
        return Err(MatchError::MacShape(s.to_string()));
    }
    for (i, p) in parts.iter().enumerate() {
        m[i] = u8::from_str_radix(p, 16).map_err(|_| MatchError::MacByte {
            byte: p.to_string(),
            mac: s.to_string(),
        })?;
    }
    Ok(m)
}

/// Parses `ADDR` or `ADDR/PREFIX` into a prefix match.
pub fn parse_ip(s: &str) -> Result<IpMatch, MatchError> {
    let (a, prefix) = match s.split_once('/') {
        Some((a, p)) => (
            a,
            Some(
                p.parse::<u8>()
                    .map_err(|_| MatchError::Prefix(s.to_string()))?,
            ),
        ),
        None => (s, None),
    };
    match a
        .parse::<IpAddr>()
        .map_err(|e| MatchError::Addr(s.to_string(), e))?
    {
        IpAddr::V4(v4) => match prefix {
            Some(p) if p > 32 => Err(MatchError::Ipv4Prefix(s.to_string())),
            p => Ok(IpMatch::v4_prefix(v4, p.unwrap_or(32))),
        },
        IpAddr::V6(v6) => match prefix {
            Some(p) if p > 128 => Err(MatchError::Ipv6Prefix(s.to_string())),
            p => Ok(IpMatch::v6_prefix(v6, p.unwrap_or(128))),
        },
    }
}

/// Parses `tcp`, `udp` (any case) or a protocol number.
pub fn parse_proto(s: &str) -> Result<u8, MatchError> {
    match s.to_ascii_lowercase().as_str() {
        "tcp" => Ok(6),
        "udp" => Ok(17),
        n => n.parse().map_err(|_| MatchError::Proto(s.to_string())),
    }
}

impl MatchSpec {
    /// The compiled matcher; [`FlowMatch::matches`] then reads a parsed view.
    /// An empty spec compiles to `FlowMatch::default()`, which matches every
    /// frame.
    pub fn compile(&self) -> Result<FlowMatch, MatchError> {
        let mac = |m: &Option<String>| {
            m.as_deref()
                .map(parse_mac)
                .transpose()
                .map(|m| m.map(Masked::exact))
        };
        Ok(FlowMatch {
            dst_mac: mac(&self.dst_mac)?,
            src_mac: mac(&self.src_mac)?,
            ethertype: self.ethertype,
            src_ip: self.src_ip.as_deref().map(parse_ip).transpose()?,
            dst_ip: self.dst_ip.as_deref().map(parse_ip).transpose()?,
            ip_proto: self.proto.as_deref().map(parse_proto).transpose()?,
            src_port: self.src_port.map(Masked::exact),
            dst_port: self.dst_port.map(Masked::exact),
        })
    }

    /// Whether no field is given (the spec matches every frame).
    pub fn is_empty(&self) -> bool {
        *self == MatchSpec::default()
    }

    /// The given fields as `name value` words, in the order rule
    /// descriptions print them (`proto tcp dst-ip 10.0.0.0/8 dst-port 5201`).
    pub fn describe(&self) -> Vec<String> {
        let mut v = Vec::new();
        let mut f = |k: &str, x: Option<String>| {
            if let Some(x) = x {
                v.push(format!("{k} {x}"));
            }
        };
        f("src-mac", self.src_mac.clone());
        f("dst-mac", self.dst_mac.clone());
        f("ethertype", self.ethertype.map(|e| format!("{e:#06x}")));
        f("proto", self.proto.clone());
        f("src-ip", self.src_ip.clone());
        f("src-port", self.src_port.map(|p| p.to_string()));
        f("dst-ip", self.dst_ip.clone());
        f("dst-port", self.dst_port.map(|p| p.to_string()));
        v
    }
}

/// Keys of a rule that no field took (a `#[serde(flatten)]` catch-all).
pub type Leftovers = BTreeMap<String, serde::de::IgnoredAny>;

/// Refuses the first leftover key with serde's message for
/// `deny_unknown_fields` (``unknown field `x`, expected one of `a`, `b` ``):
/// what the rule types said before they embedded [`MatchSpec`].
pub fn reject_unknown<E: serde::de::Error>(
    rest: &Leftovers,
    fields: &'static [&'static str],
) -> Result<(), E> {
    match rest.keys().next() {
        Some(k) => Err(E::unknown_field(k, fields)),
        None => Ok(()),
    }
}

/// Implements `Serialize` and a strict `Deserialize` for a rule type that
/// embeds [`MatchSpec`] as `pub fields` (`#[serde(flatten,
/// skip_deserializing)]`) and derives serde with `#[serde(remote = "Self")]`
/// (which makes the derived code inherent functions). Deserializing reads
/// the match fields, then the type's own fields through its derived code (a
/// plain struct, so flattening it consumes its keys), and refuses any key
/// left with serde's "unknown field" error naming `$fields`.
macro_rules! strict_rule_serde {
    ($ty:ident, $fields:expr) => {
        impl ::serde::Serialize for $ty {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                $ty::serialize(self, s)
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $ty {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct Own($ty);
                impl<'de> ::serde::Deserialize<'de> for Own {
                    fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                        $ty::deserialize(d).map(Own)
                    }
                }
                // Refusing inside the derived map visit (not after it) keeps
                // the position the format adds to errors (serde_json's
                // "at line L column C", toml's span).
                fn no_unknown<'de, D: ::serde::Deserializer<'de>>(d: D) -> Result<(), D::Error> {
                    let rest =
                        <$crate::match_spec::Leftovers as ::serde::Deserialize>::deserialize(d)?;
                    $crate::match_spec::reject_unknown(&rest, $fields)
                }
                #[derive(::serde::Deserialize)]
                struct Strict {
                    #[serde(flatten)]
                    fields: $crate::match_spec::MatchSpec,
                    #[serde(flatten)]
                    own: Own,
                    #[serde(flatten, deserialize_with = "no_unknown")]
                    _rest: (),
                }
                let s = Strict::deserialize(d)?;
                Ok($ty {
                    fields: s.fields,
                    ..s.own.0
                })
            }
        }
    };
}
pub(crate) use strict_rule_serde;

/// Test check of a rule type's field list (`$fields` of
/// [`strict_rule_serde!`]): `json`, a spelling with every key, has exactly
/// the keys of `fields`, which `name` names in the failure message. The
/// list is kept by hand, so a new field must fail here until it is added.
#[cfg(test)]
pub(crate) fn assert_fields_list_every_key(json: &str, fields: &[&str], name: &str) {
    let keys: Vec<String> =
        serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(json)
            .unwrap()
            .keys()
            .cloned()
            .collect();
    let mut fields = fields.to_vec();
    fields.sort_unstable();
    assert_eq!(keys, fields, "{name} lists every key");
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::builder::FrameBuilder;

    #[test]
    fn fields_parse_with_the_old_messages() {
        let e = |r: Result<FlowMatch, MatchError>| r.unwrap_err().to_string();
        let spec = |f: fn(&mut MatchSpec)| {
            let mut m = MatchSpec::default();
            f(&mut m);
            m.compile()
        };
        assert_eq!(
            e(spec(|m| m.src_mac = Some("zz".into()))),
            "MAC \"zz\" must have six colon-separated hex bytes"
        );
        assert_eq!(
            e(spec(|m| m.dst_mac = Some("1:2:3:4:5:zz".into()))),
            "bad byte \"zz\" in MAC \"1:2:3:4:5:zz\""
        );
        assert_eq!(
            e(spec(|m| m.dst_ip = Some("10.0.0.1/x".into()))),
            "bad prefix in \"10.0.0.1/x\""
        );
        assert_eq!(
            e(spec(|m| m.dst_ip = Some("10.0.0.1/33".into()))),
            "\"10.0.0.1/33\": IPv4 prefix above 32"
        );
        assert_eq!(
            e(spec(|m| m.src_ip = Some("::1/129".into()))),
            "\"::1/129\": IPv6 prefix above 128"
        );
        assert_eq!(
            e(spec(|m| m.src_ip = Some("nope".into()))),
            "\"nope\": invalid IP address syntax"
        );
        assert_eq!(
            e(spec(|m| m.proto = Some("sctpx".into()))),
            "protocol \"sctpx\": use tcp, udp or a number"
        );
        assert_eq!(parse_proto("UDP"), Ok(17));
        assert_eq!(parse_proto("47"), Ok(47));
    }

    #[test]
    fn command_line_numbers_are_decimal_or_hex() {
        assert_eq!(parse_u16_any("0x88b5"), Ok(0x88b5));
        assert_eq!(parse_u32_any("4791"), Ok(4791));
        assert_eq!(
            parse_u8_any("256").unwrap_err().to_string(),
            "number too large to fit in target type"
        );
        assert!(parse_u16_any("0xzz").is_err());
    }

    #[test]
    fn compiled_match_reads_the_view() {
        let m = MatchSpec {
            dst_ip: Some("10.0.0.0/8".into()),
            proto: Some("tcp".into()),
            dst_port: Some(5201),
            ..MatchSpec::default()
        };
        assert_eq!(
            m.describe().join(" "),
            "proto tcp dst-ip 10.0.0.0/8 dst-port 5201"
        );
        let fm = m.compile().unwrap();
        let a: IpAddr = "192.168.0.1".parse().unwrap();
        let b: IpAddr = "10.1.2.3".parse().unwrap();
        let hit = FrameBuilder::tcp(a, 1, b, 5201).build(b"");
        let miss = FrameBuilder::udp(a, 1, b, 5201).build(b"");
        assert!(fm.matches(&crate::frame::view(&hit)));
        assert!(!fm.matches(&crate::frame::view(&miss)));
        assert!(MatchSpec::default().is_empty());
        assert_eq!(MatchSpec::default().compile(), Ok(FlowMatch::default()));
    }
}
