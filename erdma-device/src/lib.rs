//! `erdma-device`: a sans-IO model of Alibaba's Elastic RDMA adapter
//! (erdma) in RoCEv2 mode, driven through [`pci_model::PciDevice`] so that
//! the unmodified Linux `erdma` driver and rdma-core's `providers/erdma`
//! can use it.
//!
//! * [`regs`]: PCI identity, BAR layout, registers, doorbell spaces.
//! * [`device`]: [`ErdmaDevice`], the reset/init handshake, doorbells.
//! * [`cmdq`]: the command queue and every command.
//! * [`eq`], [`cq`]: event and completion queues.
//! * [`qp`], [`wqe`]: queue pairs, SQE / RQE formats.
//! * [`mr`]: MTTs (levels 0..3) and memory regions.
//! * [`datapath`]: SQ/RQ execution, UD (GSI) in the device, RC through
//!   `roce_model`.
//! * [`faults`]: device faults for the driver bench; [`names`]: the
//!   driver's names for the trace.
//! * [`config`], [`counters`].
//!
//! See `README.md` for the device specification as learnt from the driver.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cmdq;
pub mod config;
pub mod counters;
pub mod cq;
pub mod datapath;
pub mod device;
pub mod eq;
mod fault_hooks;
pub mod faults;
pub mod mr;
pub mod names;
pub mod qp;
pub mod regs;
mod store;
pub mod wqe;

pub use config::ErdmaConfig;
pub use counters::Counters;
pub use device::ErdmaDevice;

/// Compiles the README example as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
