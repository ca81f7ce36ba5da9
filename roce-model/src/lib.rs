//! `roce-model`: a sans-IO RoCEv2 / InfiniBand transport codec.
//!
//! * [`opcode`]: every RC / UC / UD opcode plus CNP and the per-opcode table
//!   (extension headers, payload rules, request/response, message position).
//! * [`headers`]: BTH and the extended transport headers with big-endian
//!   parse / write.
//! * [`packet`]: [`RocePacket`] (a borrowed view of BTH..ICRC) and
//!   [`PacketBuilder`].
//! * [`icrc`]: the invariant CRC for RoCEv2 (IPv4/IPv6), RoCEv1 and native IB.
//! * [`wire`] and [`frame`]: minimal Ethernet/IP/UDP/GRH/LRH to parse and build
//!   whole frames ([`RoceFrame`], [`FrameBuilder`], [`IbFrame`]).
//! * [`psn`]: 24-bit PSN arithmetic.
//! * [`mr`]: protection domains, memory regions, keys and access checks.
//! * [`rc`]: the sans-IO RC queue-pair engine (requester, completer,
//!   responder) with `handle_packet` / `poll_transmit` / `poll_timeout` /
//!   `handle_timeout` / `poll_completion`.
//!
//! * `pcap` (feature `testdata`): a pcap/ERF reader for tests replaying the
//!   shared golden captures.
//!
//! Parsing never panics on arbitrary input; errors are [`CodecError`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod error;
pub mod frame;
pub mod headers;
pub mod icrc;
pub mod mr;
pub mod opcode;
pub mod packet;
#[cfg(feature = "testdata")]
pub mod pcap;
pub mod psn;
pub mod rc;
pub mod wire;

pub use error::CodecError;
pub use frame::{FrameBuilder, IbFrame, NetLayer, NetParams, RoceFrame};
pub use headers::{
    credit_count, rnr_timer_usec, Aeth, AethSyndrome, AtomicAckEth, AtomicEth, Bth, Deth, Feth,
    Header, Ieth, ImmDt, NakCode, Reth,
};
pub use icrc::{icrc_grh, icrc_ib, icrc_ipv4, icrc_ipv6, vcrc, IcrcScope, ICRC_LEN};
pub use mr::{
    Access, MemError, Memory, MemoryAccess, MemoryRegion, MemoryStore, MrKeys, ProtectionDomain,
    Span,
};
pub use opcode::{HeaderSet, OpKind, Opcode, OpcodeInfo, PayloadRule, Position, Transport};
pub use packet::{ExtHeaders, PacketBuilder, RocePacket};
pub use psn::{psn_compare, Psn, PSN_MASK};
pub use rc::{
    Completion, Mtu, QpAttr, QpCaps, QpError, QpState, QpStats, QueuePair, RecvWr, SendOp, SendWr,
    Sge, SharedReceiveQueue, WcOpcode, WcStatus,
};

/// Compiles the README example as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
