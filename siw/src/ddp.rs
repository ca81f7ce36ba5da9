//! DDP (RFC 5041) and RDMAP (RFC 5040) headers, opcodes and Terminate
//! messages, as carried in the ULPDU of an MPA FPDU.
//!
//! Control word (BE16): `T(0x8000) L(0x4000) rsvd(0x3c00) DDPv(0x0300)
//! RDMAPv(0x00c0) rsvd(0x0030) opcode(0x000f)`; both versions are 1.
//!
//! * tagged header (14 bytes): `ctrl | STag(4) | TO(8)`
//! * untagged header (18 bytes): `ctrl | RsvdULP(4) | QN(4) | MSN(4) | MO(4)`

use thiserror::Error;

/// DDP version carried and accepted.
pub const DDP_VERSION: u8 = 1;
/// RDMAP version carried and accepted.
pub const RDMAP_VERSION: u8 = 1;
/// Tagged header length (ctrl + STag + TO).
pub const TAGGED_HDR_LEN: usize = 14;
/// Untagged header length (ctrl + RsvdULP + QN + MSN + MO).
pub const UNTAGGED_HDR_LEN: usize = 18;
/// Read Request body after the untagged header.
pub const READ_REQ_LEN: usize = 28;
/// Terminate control word length.
pub const TERM_CTRL_LEN: usize = 4;

/// Untagged queue numbers used by RDMAP.
pub mod qn {
    /// Send queue.
    pub const SEND: u32 = 0;
    /// RDMA Read Request queue.
    pub const READ_REQUEST: u32 = 1;
    /// Terminate queue.
    pub const TERMINATE: u32 = 2;
}

/// RDMAP opcodes (siw implements nothing above 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// RDMA Write (tagged).
    Write = 0,
    /// RDMA Read Request (untagged, QN 1).
    ReadRequest = 1,
    /// RDMA Read Response (tagged).
    ReadResponse = 2,
    /// Send (QN 0).
    Send = 3,
    /// Send with Invalidate.
    SendInvalidate = 4,
    /// Send with Solicited Event.
    SendSe = 5,
    /// Send with Solicited Event and Invalidate.
    SendSeInvalidate = 6,
    /// Terminate (QN 2).
    Terminate = 7,
}

impl Opcode {
    /// Decodes the 4-bit opcode.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Write,
            1 => Self::ReadRequest,
            2 => Self::ReadResponse,
            3 => Self::Send,
            4 => Self::SendInvalidate,
            5 => Self::SendSe,
            6 => Self::SendSeInvalidate,
            7 => Self::Terminate,
            _ => return None,
        })
    }

    /// Write and Read Response use the tagged buffer model.
    pub fn is_tagged(self) -> bool {
        matches!(self, Self::Write | Self::ReadResponse)
    }

    /// One of the four Send variants.
    pub fn is_send(self) -> bool {
        matches!(
            self,
            Self::Send | Self::SendInvalidate | Self::SendSe | Self::SendSeInvalidate
        )
    }

    /// DDP header + RDMAP header length for this opcode.
    pub fn hdr_len(self) -> usize {
        match self {
            Self::Write | Self::ReadResponse => TAGGED_HDR_LEN,
            Self::ReadRequest => UNTAGGED_HDR_LEN + READ_REQ_LEN,
            Self::Terminate => UNTAGGED_HDR_LEN + TERM_CTRL_LEN,
            _ => UNTAGGED_HDR_LEN,
        }
    }
}

/// Buffer-model specific part of a DDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DdpHdr {
    /// Tagged buffer model.
    Tagged {
        /// Steering tag of the sink buffer.
        stag: u32,
        /// Tagged offset.
        to: u64,
    },
    /// Untagged buffer model.
    Untagged {
        /// RsvdULP: the STag to invalidate for Send with Invalidate, else 0.
        rsvd_ulp: u32,
        /// Queue number.
        qn: u32,
        /// Message sequence number (starts at 1 per queue).
        msn: u32,
        /// Message offset.
        mo: u32,
    },
}

/// A decoded DDP/RDMAP header (without RDMAP extension headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// L: last DDP segment of the message.
    pub last: bool,
    /// RDMAP opcode.
    pub opcode: Opcode,
    /// DDP fields.
    pub ddp: DdpHdr,
}

impl Header {
    /// A tagged header.
    pub fn tagged(opcode: Opcode, last: bool, stag: u32, to: u64) -> Self {
        Self {
            last,
            opcode,
            ddp: DdpHdr::Tagged { stag, to },
        }
    }

    /// An untagged header.
    pub fn untagged(opcode: Opcode, last: bool, rsvd_ulp: u32, qn: u32, msn: u32, mo: u32) -> Self {
        Self {
            last,
            opcode,
            ddp: DdpHdr::Untagged {
                rsvd_ulp,
                qn,
                msn,
                mo,
            },
        }
    }

    /// Encoded length (14 or 18).
    pub fn len(&self) -> usize {
        match self.ddp {
            DdpHdr::Tagged { .. } => TAGGED_HDR_LEN,
            DdpHdr::Untagged { .. } => UNTAGGED_HDR_LEN,
        }
    }

    /// Never empty; provided for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Control word.
    pub fn ctrl(&self) -> u16 {
        let mut c =
            ((DDP_VERSION as u16) << 8) | ((RDMAP_VERSION as u16) << 6) | self.opcode as u16;
        if matches!(self.ddp, DdpHdr::Tagged { .. }) {
            c |= 0x8000;
        }
        if self.last {
            c |= 0x4000;
        }
        c
    }

    /// Appends the encoded header.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.ctrl().to_be_bytes());
        match self.ddp {
            DdpHdr::Tagged { stag, to } => {
                out.extend_from_slice(&stag.to_be_bytes());
                out.extend_from_slice(&to.to_be_bytes());
            }
            DdpHdr::Untagged {
                rsvd_ulp,
                qn,
                msn,
                mo,
            } => {
                out.extend_from_slice(&rsvd_ulp.to_be_bytes());
                out.extend_from_slice(&qn.to_be_bytes());
                out.extend_from_slice(&msn.to_be_bytes());
                out.extend_from_slice(&mo.to_be_bytes());
            }
        }
    }

    /// Decodes the DDP header at the start of a ULPDU and returns it with the
    /// rest of the ULPDU. Errors carry the Terminate codes to report.
    pub fn decode(ulpdu: &[u8]) -> Result<(Header, &[u8]), TermError> {
        if ulpdu.len() < 2 {
            return Err(TermError::ddp_catastrophic());
        }
        let c = u16::from_be_bytes([ulpdu[0], ulpdu[1]]);
        let tagged = c & 0x8000 != 0;
        let ddp_ver = ((c >> 8) & 3) as u8;
        if ddp_ver != DDP_VERSION {
            return Err(if tagged {
                TermError::ddp_tagged(ddp_ecode::T_VERSION)
            } else {
                TermError::ddp_untagged(ddp_ecode::UT_VERSION)
            });
        }
        if ((c >> 6) & 3) as u8 != RDMAP_VERSION {
            return Err(TermError::rdmap(
                rdmap_etype::REMOTE_OPERATION,
                rdmap_ecode::VERSION,
            ));
        }
        let opcode = Opcode::from_u8((c & 0xf) as u8).ok_or(TermError::rdmap(
            rdmap_etype::REMOTE_OPERATION,
            rdmap_ecode::OPCODE,
        ))?;
        if opcode.is_tagged() != tagged {
            return Err(TermError::rdmap(
                rdmap_etype::REMOTE_OPERATION,
                rdmap_ecode::OPCODE,
            ));
        }
        let last = c & 0x4000 != 0;
        let be32 = |o: usize| u32::from_be_bytes(ulpdu[o..o + 4].try_into().expect("4"));
        if tagged {
            if ulpdu.len() < TAGGED_HDR_LEN {
                return Err(TermError::ddp_catastrophic());
            }
            let to = u64::from_be_bytes(ulpdu[6..14].try_into().expect("8"));
            Ok((
                Header::tagged(opcode, last, be32(2), to),
                &ulpdu[TAGGED_HDR_LEN..],
            ))
        } else {
            if ulpdu.len() < UNTAGGED_HDR_LEN {
                return Err(TermError::ddp_catastrophic());
            }
            Ok((
                Header::untagged(opcode, last, be32(2), be32(6), be32(10), be32(14)),
                &ulpdu[UNTAGGED_HDR_LEN..],
            ))
        }
    }
}

/// RDMA Read Request body (after the untagged header, QN 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadRequest {
    /// STag of the requester's sink buffer.
    pub sink_stag: u32,
    /// Tagged offset in the sink buffer.
    pub sink_to: u64,
    /// Bytes to read.
    pub size: u32,
    /// STag of the responder's source buffer.
    pub src_stag: u32,
    /// Tagged offset in the source buffer.
    pub src_to: u64,
}

impl ReadRequest {
    /// Appends the 28-byte body.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.sink_stag.to_be_bytes());
        out.extend_from_slice(&self.sink_to.to_be_bytes());
        out.extend_from_slice(&self.size.to_be_bytes());
        out.extend_from_slice(&self.src_stag.to_be_bytes());
        out.extend_from_slice(&self.src_to.to_be_bytes());
    }

    /// Decodes the body; `None` if shorter than 28 bytes.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < READ_REQ_LEN {
            return None;
        }
        let be32 = |o: usize| u32::from_be_bytes(b[o..o + 4].try_into().expect("4"));
        let be64 = |o: usize| u64::from_be_bytes(b[o..o + 8].try_into().expect("8"));
        Some(Self {
            sink_stag: be32(0),
            sink_to: be64(4),
            size: be32(12),
            src_stag: be32(16),
            src_to: be64(20),
        })
    }
}

/// Layer that detected an error (Terminate `Layer` nibble).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    /// RDMAP (0).
    Rdmap,
    /// DDP (1).
    Ddp,
    /// LLP, i.e. MPA (2).
    Llp,
    /// Anything else received on the wire.
    Other(u8),
}

impl Layer {
    /// The 4-bit wire value.
    pub fn to_u8(self) -> u8 {
        match self {
            Self::Rdmap => 0,
            Self::Ddp => 1,
            Self::Llp => 2,
            Self::Other(v) => v & 0xf,
        }
    }

    /// From the 4-bit wire value.
    pub fn from_u8(v: u8) -> Self {
        match v & 0xf {
            0 => Self::Rdmap,
            1 => Self::Ddp,
            2 => Self::Llp,
            v => Self::Other(v),
        }
    }
}

/// RDMAP error types.
pub mod rdmap_etype {
    /// Local catastrophic error.
    pub const CATASTROPHIC: u8 = 0;
    /// Remote protection error.
    pub const REMOTE_PROTECTION: u8 = 1;
    /// Remote operation error.
    pub const REMOTE_OPERATION: u8 = 2;
}

/// RDMAP error codes.
pub mod rdmap_ecode {
    /// Invalid STag.
    pub const INVALID_STAG: u8 = 0x00;
    /// Base or bounds violation.
    pub const BASE_BOUNDS: u8 = 0x01;
    /// Access rights violation.
    pub const ACCESS_RIGHTS: u8 = 0x02;
    /// STag not associated with RDMAP stream.
    pub const STAG_NOT_ASSOC: u8 = 0x03;
    /// TO wrap.
    pub const TO_WRAP: u8 = 0x04;
    /// Invalid RDMAP version.
    pub const VERSION: u8 = 0x05;
    /// Unexpected opcode.
    pub const OPCODE: u8 = 0x06;
    /// Catastrophic error, localised to RDMAP stream.
    pub const CATASTROPHIC_STREAM: u8 = 0x07;
    /// Catastrophic error, global.
    pub const CATASTROPHIC_GLOBAL: u8 = 0x08;
    /// STag cannot be invalidated.
    pub const CANNOT_INVALIDATE: u8 = 0x09;
    /// Unspecified.
    pub const UNSPECIFIED: u8 = 0xff;
}

/// DDP error types.
pub mod ddp_etype {
    /// Local catastrophic.
    pub const CATASTROPHIC: u8 = 0;
    /// Tagged buffer error.
    pub const TAGGED_BUF: u8 = 1;
    /// Untagged buffer error.
    pub const UNTAGGED_BUF: u8 = 2;
    /// Reserved for the RDMA protocol.
    pub const RSVD: u8 = 3;
}

/// DDP error codes (meaning depends on the etype).
pub mod ddp_ecode {
    /// Catastrophic (etype 0).
    pub const CATASTROPHIC: u8 = 0x00;
    /// Tagged: invalid STag.
    pub const T_INVALID_STAG: u8 = 0x00;
    /// Tagged: base or bounds violation.
    pub const T_BASE_BOUNDS: u8 = 0x01;
    /// Tagged: STag not associated with the stream.
    pub const T_STAG_NOT_ASSOC: u8 = 0x02;
    /// Tagged: TO wrap.
    pub const T_TO_WRAP: u8 = 0x03;
    /// Tagged: invalid DDP version.
    pub const T_VERSION: u8 = 0x04;
    /// Untagged: invalid QN.
    pub const UT_INVALID_QN: u8 = 0x01;
    /// Untagged: invalid MSN, no buffer available.
    pub const UT_INVALID_MSN_NOBUF: u8 = 0x02;
    /// Untagged: invalid MSN, MSN range.
    pub const UT_INVALID_MSN_RANGE: u8 = 0x03;
    /// Untagged: invalid MO.
    pub const UT_INVALID_MO: u8 = 0x04;
    /// Untagged: message too long for the buffer.
    pub const UT_MSG_TOOLONG: u8 = 0x05;
    /// Untagged: invalid DDP version.
    pub const UT_VERSION: u8 = 0x06;
}

/// LLP (MPA) error codes; the etype is always 0 (MPA).
pub mod llp_ecode {
    /// TCP stream lost.
    pub const TCP_STREAM_LOST: u8 = 0x01;
    /// Received MPA CRC does not match.
    pub const RECEIVED_CRC: u8 = 0x02;
    /// Marker / ULPDU length mismatch (FPDU start error).
    pub const FPDU_START: u8 = 0x03;
    /// Invalid MPA Request/Reply.
    pub const INVALID_REQ_RESP: u8 = 0x04;
    /// Local catastrophic (enhanced setup).
    pub const LOCAL_CATASTROPHIC: u8 = 0x05;
    /// Insufficient IRD (enhanced setup).
    pub const INSUFFICIENT_IRD: u8 = 0x06;
    /// No matching RTR (enhanced setup).
    pub const NO_MATCHING_RTR: u8 = 0x07;
}

/// Layer / error type / error code triple of a Terminate message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
#[error("{layer:?} etype {etype} ecode {ecode:#04x}")]
pub struct TermError {
    /// Layer.
    pub layer: Layer,
    /// Error type (4 bits).
    pub etype: u8,
    /// Error code.
    pub ecode: u8,
}

impl TermError {
    /// RDMAP layer error.
    pub const fn rdmap(etype: u8, ecode: u8) -> Self {
        Self {
            layer: Layer::Rdmap,
            etype,
            ecode,
        }
    }
    /// DDP tagged buffer error.
    pub const fn ddp_tagged(ecode: u8) -> Self {
        Self {
            layer: Layer::Ddp,
            etype: ddp_etype::TAGGED_BUF,
            ecode,
        }
    }
    /// DDP untagged buffer error.
    pub const fn ddp_untagged(ecode: u8) -> Self {
        Self {
            layer: Layer::Ddp,
            etype: ddp_etype::UNTAGGED_BUF,
            ecode,
        }
    }
    /// DDP local catastrophic error.
    pub const fn ddp_catastrophic() -> Self {
        Self {
            layer: Layer::Ddp,
            etype: ddp_etype::CATASTROPHIC,
            ecode: ddp_ecode::CATASTROPHIC,
        }
    }
    /// LLP (MPA) error.
    pub const fn llp(ecode: u8) -> Self {
        Self {
            layer: Layer::Llp,
            etype: 0,
            ecode,
        }
    }
}

/// Body of a Terminate message (after its untagged header, QN 2).
///
/// ```text
/// Layer(4) EType(4) ECode(8) M D R rsvd(13)
/// [DDP segment length(2)  if M] [terminated DDP header if D] [terminated RDMAP header if R]
/// ```
///
/// The segment length and the copied headers are kept as raw bytes in
/// `hdrs` (which is exactly the start of the offending FPDU, MPA length field
/// included, as siw sends it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terminate {
    /// Error triple.
    pub error: TermError,
    /// M: DDP segment length present.
    pub m: bool,
    /// D: DDP header present.
    pub d: bool,
    /// R: RDMAP header present.
    pub r: bool,
    /// Copied segment length and headers.
    pub hdrs: Vec<u8>,
}

impl Terminate {
    /// A Terminate without header copies.
    pub fn new(error: TermError) -> Self {
        Self {
            error,
            m: false,
            d: false,
            r: false,
            hdrs: Vec::new(),
        }
    }

    /// Attaches a copy of the offending FPDU's length field and headers.
    /// `ulpdu` is the offending ULPDU.
    pub fn with_offending(mut self, ulpdu: &[u8]) -> Self {
        let Ok((h, _)) = Header::decode(ulpdu) else {
            return self;
        };
        let ddp_len = h.len();
        let rdmap_len = match h.opcode {
            Opcode::ReadRequest => READ_REQ_LEN,
            _ => 0,
        };
        let n = (ddp_len + rdmap_len).min(ulpdu.len());
        self.m = true;
        self.d = true;
        self.r = rdmap_len > 0 && n == ddp_len + rdmap_len;
        self.hdrs.clear();
        self.hdrs
            .extend_from_slice(&(ulpdu.len().min(u16::MAX as usize) as u16).to_be_bytes());
        self.hdrs.extend_from_slice(&ulpdu[..n]);
        self
    }

    /// The copied DDP header, decoded, if present.
    pub fn offending_header(&self) -> Option<Header> {
        if !self.d {
            return None;
        }
        let off = if self.m { 2 } else { 0 };
        Header::decode(self.hdrs.get(off..)?).ok().map(|(h, _)| h)
    }

    /// Appends the body.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = (self.error.layer.to_u8() as u32) << 28
            | ((self.error.etype & 0xf) as u32) << 24
            | (self.error.ecode as u32) << 16;
        if self.m {
            w |= 0x8000;
        }
        if self.d {
            w |= 0x4000;
        }
        if self.r {
            w |= 0x2000;
        }
        out.extend_from_slice(&w.to_be_bytes());
        out.extend_from_slice(&self.hdrs);
    }

    /// Decodes the body; `None` if shorter than 4 bytes.
    pub fn decode(b: &[u8]) -> Option<Self> {
        let w = u32::from_be_bytes(b.get(..4)?.try_into().ok()?);
        Some(Self {
            error: TermError {
                layer: Layer::from_u8((w >> 28) as u8),
                etype: ((w >> 24) & 0xf) as u8,
                ecode: (w >> 16) as u8,
            },
            m: w & 0x8000 != 0,
            d: w & 0x4000 != 0,
            r: w & 0x2000 != 0,
            hdrs: b[4..].to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctrl_word_values() {
        // Tagged, last, Write: 0xC140 (as seen in siw captures).
        assert_eq!(Header::tagged(Opcode::Write, true, 1, 0).ctrl(), 0xc140);
        // Untagged Send, last: 0x4143.
        assert_eq!(
            Header::untagged(Opcode::Send, true, 0, 0, 1, 0).ctrl(),
            0x4143
        );
        // Read Request: 0x4141.
        assert_eq!(
            Header::untagged(Opcode::ReadRequest, true, 0, 1, 1, 0).ctrl(),
            0x4141
        );
    }

    #[test]
    fn bad_version_and_opcode() {
        let mut v = Vec::new();
        Header::tagged(Opcode::Write, true, 1, 0).encode(&mut v);
        v[0] = 0xc2; // DDP version 2
        assert_eq!(
            Header::decode(&v).unwrap_err(),
            TermError::ddp_tagged(ddp_ecode::T_VERSION)
        );
        v[0] = 0xc1;
        v[1] = 0x48; // opcode 8
        assert_eq!(
            Header::decode(&v).unwrap_err(),
            TermError::rdmap(rdmap_etype::REMOTE_OPERATION, rdmap_ecode::OPCODE)
        );
    }

    #[test]
    fn terminate_with_offending_header() {
        let mut u = Vec::new();
        Header::untagged(Opcode::ReadRequest, true, 0, 1, 1, 0).encode(&mut u);
        ReadRequest {
            sink_stag: 1,
            sink_to: 2,
            size: 3,
            src_stag: 4,
            src_to: 5,
        }
        .encode(&mut u);
        let t = Terminate::new(TermError::rdmap(
            rdmap_etype::REMOTE_PROTECTION,
            rdmap_ecode::ACCESS_RIGHTS,
        ))
        .with_offending(&u);
        assert!(t.m && t.d && t.r);
        let mut b = Vec::new();
        t.encode(&mut b);
        assert_eq!(&b[..4], &[0x01, 0x02, 0xe0, 0x00]);
        let d = Terminate::decode(&b).unwrap();
        assert_eq!(d, t);
        assert_eq!(d.offending_header().unwrap().opcode, Opcode::ReadRequest);
    }
}
