//! RoCEv2 (IBTA vol. 1 annex A17): the UDP port and the Base Transport
//! Header length. The transport itself is `roce-model`'s.

/// UDP destination port of RoCEv2 (IANA).
pub const ROCEV2_PORT: u16 = 4791;
/// Length of the RoCEv2 Base Transport Header.
pub const BTH_LEN: usize = 12;
/// Length of the invariant CRC that ends every RoCE packet.
pub const ICRC_LEN: usize = 4;
