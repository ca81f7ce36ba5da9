//! Errors produced by the codec.

use thiserror::Error;

/// Everything that can go wrong while parsing or building RoCE / IB packets.
///
/// Parsing never panics: every malformed input maps to one of these variants.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CodecError {
    /// The buffer ended before the named header or field was complete.
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        /// Which header or region was being read.
        what: &'static str,
        /// Bytes required.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The BTH opcode is not one this codec knows (RD, XRC, reserved, ...).
    #[error("unsupported or reserved BTH opcode {0:#04x}")]
    BadOpcode(u8),
    /// BTH transport header version is not 0.
    #[error("unsupported BTH transport version {0}")]
    BadTver(u8),
    /// PadCnt larger than the bytes between the headers and the ICRC.
    #[error("pad count {pad} exceeds the {avail} bytes after the headers")]
    BadPad {
        /// PadCnt from the BTH.
        pad: u8,
        /// Bytes between the end of the headers and the ICRC.
        avail: usize,
    },
    /// Payload plus pad is not a multiple of 4 bytes.
    #[error("payload+pad length {0} is not a multiple of 4")]
    Misaligned(usize),
    /// The payload length breaks the opcode's fixed-size rule.
    #[error("opcode {opcode:#04x} requires {expected} payload bytes, got {actual}")]
    PayloadLength {
        /// The opcode.
        opcode: u8,
        /// The payload length the opcode requires.
        expected: usize,
        /// The payload length present.
        actual: usize,
    },
    /// A length field disagrees with the buffer (IP total length, UDP length, LRH length...).
    #[error("{what} length mismatch: header says {declared}, buffer has {actual}")]
    LengthMismatch {
        /// Which length field.
        what: &'static str,
        /// Value from the header.
        declared: usize,
        /// Value derived from the buffer.
        actual: usize,
    },
    /// The ICRC in the packet does not match the computed one.
    #[error("ICRC mismatch: computed {computed:#010x}, packet carries {found:#010x}")]
    IcrcMismatch {
        /// CRC computed over the masked packet (numeric value; wire bytes are its LE encoding).
        computed: u32,
        /// CRC read little-endian from the packet.
        found: u32,
    },
    /// The IB VCRC does not match.
    #[error("VCRC mismatch: computed {computed:#06x}, packet carries {found:#06x}")]
    VcrcMismatch {
        /// Computed VCRC.
        computed: u16,
        /// VCRC read little-endian from the packet.
        found: u16,
    },
    /// The builder lacks an extension header the opcode requires.
    #[error("opcode {opcode:#04x} requires the {header} header")]
    MissingHeader {
        /// The opcode.
        opcode: u8,
        /// The missing header's name.
        header: &'static str,
    },
    /// The builder was given an extension header the opcode does not carry.
    #[error("opcode {opcode:#04x} does not carry a {header} header")]
    UnexpectedHeader {
        /// The opcode.
        opcode: u8,
        /// The superfluous header's name.
        header: &'static str,
    },
    /// A field value does not fit its wire width.
    #[error("field {field} value {value:#x} does not fit in {bits} bits")]
    FieldRange {
        /// Field name.
        field: &'static str,
        /// Offending value.
        value: u64,
        /// Wire width in bits.
        bits: u32,
    },
    /// The frame is not RoCE (wrong ethertype, IP protocol, UDP port, LNH...).
    #[error("not a RoCE frame: {0}")]
    NotRoce(&'static str),
    /// An outer header (Ethernet/IP/UDP/LRH/GRH) is malformed.
    #[error("malformed {0} header")]
    BadHeader(&'static str),
    /// The output buffer is too small for the header being emitted.
    #[error("output buffer too small: need {need}, have {have}")]
    BufferTooSmall {
        /// Bytes required.
        need: usize,
        /// Bytes available.
        have: usize,
    },
}

/// Shorthand result type.
pub type Result<T, E = CodecError> = core::result::Result<T, E>;

/// Return `buf[..n]` or a [`CodecError::Truncated`] naming `what`.
pub(crate) fn need<'a>(buf: &'a [u8], n: usize, what: &'static str) -> Result<&'a [u8]> {
    buf.get(..n).ok_or(CodecError::Truncated {
        what,
        need: n,
        have: buf.len(),
    })
}

/// Return `buf[..n]` mutably or a [`CodecError::BufferTooSmall`].
pub(crate) fn need_mut(buf: &mut [u8], n: usize) -> Result<&mut [u8]> {
    let have = buf.len();
    buf.get_mut(..n)
        .ok_or(CodecError::BufferTooSmall { need: n, have })
}

/// Check that `value` fits in `bits` bits.
pub(crate) fn check_bits(field: &'static str, value: u64, bits: u32) -> Result<()> {
    if bits < 64 && value >> bits != 0 {
        return Err(CodecError::FieldRange { field, value, bits });
    }
    Ok(())
}
