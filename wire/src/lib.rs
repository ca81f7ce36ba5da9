//! `wire`: the frames the fabric carries, in one place: typed zero-copy
//! views, builders, checksums, TCP/UDP segmentation and the protocol
//! constants. Every crate of the workspace that reads or writes Ethernet
//! frames takes them from here.
//!
//! - [`ethernet`]: header lengths, ethertypes, the VLAN tag.
//! - [`ip`]: IP protocol numbers, IPv4/IPv6 header lengths and flags,
//!   rewriting the IP length fields.
//! - [`l4`]: TCP/UDP header lengths, TCP flags, [`L4Proto`](l4::L4Proto).
//! - [`roce`] and [`vxlan`]: the UDP ports and header lengths of RoCEv2 and
//!   VXLAN.
//! - [`parse`](mod@parse): [`ParsedFrame`], the one `Copy` view of a frame (Ethernet
//!   with one VLAN tag, IPv4 with options and fragments, IPv6 with
//!   extension headers, TCP, UDP, the RoCEv2 BTH). Never panics.
//! - [`builder`]: [`FrameBuilder`](builder::FrameBuilder), frames for tests
//!   and examples.
//! - [`checksum`]: the Internet checksum, pseudo-headers, filling the IPv4
//!   and TCP/UDP checksums of a frame.
//! - [`tso`]: one TCP/UDP segmentation offload.
//! - [`capture`]: reading pcapng and classic pcap captures back, one frame
//!   at a time (`vhost-rdma check-capture`, the tests' golden captures).
//!
//! The crate opens nothing itself (the capture reader reads from the
//! caller's `Read`), allocates only where it builds frames or reads a
//! capture, and depends only on `thiserror`.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod arp;
pub mod builder;
pub mod capture;
pub mod checksum;
pub mod ethernet;
pub mod ip;
pub mod l4;
pub mod parse;
pub mod roce;
pub mod tso;
pub mod vxlan;

#[cfg(feature = "parse-count")]
pub use parse::parse_calls;
pub use parse::{parse, ParsedFrame};

/// Compiles the README example as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
