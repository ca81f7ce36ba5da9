//! The device trace: one record per driver/device interaction, decoded with
//! the names the driver uses (`ctl trace`).
//!
//! The edge records what it sees itself (register reads and writes, with the
//! name [`crate::PciDevice::register_name`] gives; interrupts raised; DMA
//! map/unmap; resets). A model adds what only it can decode, through
//! [`crate::DeviceIo::trace`]: doorbells and what they start, admin- and
//! command-queue commands with their fields and status, completions and
//! events written, faults that fired. When no trace runs,
//! [`crate::DeviceIo::tracing`] is false and recording costs one branch.

use std::fmt;
use std::time::Duration;

/// What a record is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceKind {
    /// A driver read of a register.
    RegRead,
    /// A driver write of a register.
    RegWrite,
    /// A doorbell and the work it starts.
    Doorbell,
    /// An admin-queue or command-queue command, its fields and status.
    Command,
    /// A completion the device wrote (CQE, admin status).
    Completion,
    /// An event the device wrote (AEQ/CEQ entry, status change).
    Event,
    /// An interrupt raised.
    Irq,
    /// A DMA region mapped or unmapped.
    Dma,
    /// A device reset.
    Reset,
    /// A device fault fired.
    Fault,
}

impl TraceKind {
    /// The short name the trace prints.
    pub fn name(self) -> &'static str {
        match self {
            TraceKind::RegRead => "rd",
            TraceKind::RegWrite => "wr",
            TraceKind::Doorbell => "db",
            TraceKind::Command => "cmd",
            TraceKind::Completion => "cqe",
            TraceKind::Event => "event",
            TraceKind::Irq => "irq",
            TraceKind::Dma => "dma",
            TraceKind::Reset => "reset",
            TraceKind::Fault => "fault",
        }
    }
}

impl fmt::Display for TraceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`: the record's `{:<5}` column applies.
        f.pad(self.name())
    }
}

/// One record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRecord {
    /// Device time ([`crate::DeviceIo::device_time`]).
    pub at: Duration,
    /// What it is about.
    pub kind: TraceKind,
    /// The decoded text (`CREATE_QP qpn=5 sq_depth=256 -> status 0`).
    pub text: String,
}

impl fmt::Display for TraceRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let us = self.at.as_micros();
        write!(
            f,
            "{}.{:06} {:<5} {}",
            us / 1_000_000,
            us % 1_000_000,
            self.kind,
            self.text
        )
    }
}
