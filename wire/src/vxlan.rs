//! VXLAN (RFC 7348): the UDP port and the header length.

/// The IANA VXLAN UDP port (Linux's `dstport 4789`).
pub const VXLAN_PORT: u16 = 4789;
/// Length of the VXLAN header.
pub const VXLAN_HLEN: usize = 8;
