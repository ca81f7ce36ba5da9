//! TCP and UDP: header lengths, checksum field offsets, TCP flags.

use crate::ip::{IPPROTO_TCP, IPPROTO_UDP};

/// Length of a TCP header without options.
pub const TCP_MIN_HLEN: usize = 20;
/// Length of a UDP header.
pub const UDP_HLEN: usize = 8;

/// TCP FIN flag.
pub const TCP_FIN: u8 = 0x01;
/// TCP SYN flag.
pub const TCP_SYN: u8 = 0x02;
/// TCP RST flag.
pub const TCP_RST: u8 = 0x04;
/// TCP PSH flag.
pub const TCP_PSH: u8 = 0x08;
/// TCP ACK flag.
pub const TCP_ACK: u8 = 0x10;
/// TCP URG flag.
pub const TCP_URG: u8 = 0x20;
/// TCP ECE flag.
pub const TCP_ECE: u8 = 0x40;
/// TCP CWR flag.
pub const TCP_CWR: u8 = 0x80;
/// Offset of the flags byte in the TCP header.
pub const TCP_FLAGS_OFFSET: usize = 13;
/// Offset of the sequence number in the TCP header.
pub const TCP_SEQ_OFFSET: usize = 4;

/// Transport protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl L4Proto {
    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            L4Proto::Tcp => IPPROTO_TCP,
            L4Proto::Udp => IPPROTO_UDP,
        }
    }

    /// Offset of the checksum field in the header.
    pub fn checksum_offset(self) -> usize {
        match self {
            L4Proto::Tcp => 16,
            L4Proto::Udp => 6,
        }
    }
}
