//! `devmem-nic`: a sans-IO model of a NIC's receive path, for testing
//! RSS, flow steering and header/data split (the devmem TCP prerequisites)
//! against unmodified guests.
//!
//! Frames go through, in order:
//!
//! 1. [`wire::parse()`]: Ethernet (+ one VLAN tag), IPv4 (options,
//!    fragments), IPv6 (extension headers, Home Address option, type 2
//!    Routing header), TCP, UDP, RoCEv2 BTH. Never panics. The result is the
//!    one `Copy` view of a frame that callers share between their stages.
//! 2. [`steering`]: flow rules with masks, priorities and `Queue`/`Drop`
//!    actions, evaluated before RSS.
//! 3. [`rss`]: the virtio-net hash-type selection and [`toeplitz`] hash,
//!    indirection table, unclassified queue and `hash_report` value.
//! 4. [`queue`]: header/data split and placement into per-queue
//!    [`pool`]s of fixed-size buffers; exhaustion drops and counts, buffers
//!    still held are never reused.
//!
//! [`Nic::classify`] explains every decision ([`Reason`]); [`Nic::receive`]
//! also places the frame and counts. The crate does no I/O and touches no
//! memory: a [`Placement`] says which frame bytes go into which buffer id, and
//! the caller copies them (into guest memory, a dmabuf, ...).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod error;
pub mod nic;
pub mod pool;
pub mod queue;
pub mod rss;
pub mod steering;
pub mod toeplitz;

pub use error::NicError;
pub use nic::{Decision, Delivery, Nic, NicConfig, NicCounters, Reason, RxOutcome};
pub use pool::{BufferId, BufferPool};
pub use queue::{DropReason, HdsConfig, Placement, QueueConfig, QueueCounters, RxQueue, Segment};
pub use rss::{hash_types, HashConfig, HashReport, HashResult, RssConfig, RssLimits};
pub use steering::{Action, FlowMatch, FlowRule, IpMatch, Maskable, Masked, RuleTable};
pub use toeplitz::{toeplitz_hash, DEFAULT_RSS_KEY};

/// Compiles the README example as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
