//! The `ctl` side of the binary: clap arguments and the printing of replies.
//! Only the binary prints; the library answers with data.

pub mod checker;
pub mod faults;
pub mod steering;

/// The L2-L4 match fields of `ctl faults add` and `ctl flow-rule add` (the
/// same fields as `faults::FaultSpec` and `steering::FlowRuleSpec` take).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct MatchArgs {
    /// Source MAC address.
    #[arg(long, value_name = "MAC")]
    pub src_mac: Option<String>,
    /// Destination MAC address.
    #[arg(long, value_name = "MAC")]
    pub dst_mac: Option<String>,
    /// EtherType (decimal or 0x hex).
    #[arg(long, value_parser = parse_u16_any)]
    pub ethertype: Option<u16>,
    /// ADDR or ADDR/PREFIX (IPv4 or IPv6).
    #[arg(long, value_name = "IP[/LEN]")]
    pub src_ip: Option<String>,
    /// ADDR or ADDR/PREFIX (IPv4 or IPv6).
    #[arg(long, value_name = "IP[/LEN]")]
    pub dst_ip: Option<String>,
    /// tcp, udp or a protocol number.
    #[arg(long)]
    pub proto: Option<String>,
    /// L4 source port.
    #[arg(long)]
    pub src_port: Option<u16>,
    /// L4 destination port.
    #[arg(long)]
    pub dst_port: Option<u16>,
}

macro_rules! parse_any {
    ($name:ident, $ty:ty) => {
        /// Decimal or 0x-prefixed hexadecimal.
        pub fn $name(s: &str) -> Result<$ty, String> {
            match s.strip_prefix("0x") {
                Some(h) => <$ty>::from_str_radix(h, 16),
                None => s.parse(),
            }
            .map_err(|e| e.to_string())
        }
    };
}
parse_any!(parse_u8_any, u8);
parse_any!(parse_u16_any, u16);
parse_any!(parse_u32_any, u32);
