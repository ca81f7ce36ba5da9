//! Errors of the codec and of the connection manager.

use thiserror::Error;

/// Why a MAD or a CM operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CmError {
    /// Shorter than a 256-byte MAD.
    #[error("MAD truncated: {len} bytes, need 256")]
    Truncated {
        /// Bytes received.
        len: usize,
    },
    /// Base version other than 1.
    #[error("MAD base version {0}, expected 1")]
    BaseVersion(u8),
    /// Management class other than CM (0x07).
    #[error("management class {0:#04x} is not CM (0x07)")]
    NotCm(u8),
    /// CM class version other than 2.
    #[error("CM class version {0}, expected 2")]
    ClassVersion(u8),
    /// Method other than Send (0x03).
    #[error("MAD method {0:#04x}, CM uses Send (0x03)")]
    Method(u8),
    /// Attribute we do not handle (SIDR, LAP, APR, ClassPortInfo, unknown).
    #[error("unsupported CM attribute {0:#06x}")]
    UnknownAttribute(u16),
    /// A variable field is larger than its slot.
    #[error("{field} is {len} bytes, at most {max} fit")]
    FieldTooLong {
        /// Which field.
        field: &'static str,
        /// Its slot size.
        max: usize,
        /// Requested length.
        len: usize,
    },
    /// rdma_cm header too short or of an unknown version.
    #[error("rdma_cm header: {0}")]
    CmaHeader(&'static str),
    /// A limit of `CmLimits` was hit.
    #[error("CM limit reached: {0}")]
    Limit(&'static str),
    /// No connection with this ID.
    #[error("no CM connection {0:#x}")]
    UnknownConnection(u32),
    /// The operation does not fit the connection's state.
    #[error("CM connection {id:#x} is {state}, cannot {op}")]
    WrongState {
        /// Connection.
        id: u32,
        /// Its state.
        state: &'static str,
        /// What was asked.
        op: &'static str,
    },
    /// Already listening on this service ID.
    #[error("already listening on service ID {0:#018x}")]
    AlreadyListening(u64),
}
