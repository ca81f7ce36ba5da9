//! MPA (RFC 5044, enhanced connection setup RFC 6581): Request/Reply frames,
//! negotiation and FPDU framing.
//!
//! Wire layout of a Request/Reply (all fields big-endian):
//!
//! ```text
//! key[16] | flags(1) M C R H gso rsvd[3] | rev(1) | pd_len(2) | private data
//! ```
//!
//! With `rev == 2` and `H` set, the first 4 bytes of the private data are the
//! IRD/ORD block ([`IrdOrd`]).
//!
//! FPDU layout:
//!
//! ```text
//! ULPDU_Length(2, BE) | ULPDU | pad to a multiple of 4 | CRC32c(4, LE)
//! ```
//!
//! The CRC field is **always present**; it is zero when CRC was not
//! negotiated. The CRC is the standard CRC-32C over length, ULPDU and pad,
//! written in little-endian byte order (as in iSCSI and Linux siw).

use thiserror::Error;

/// Key of an MPA Request frame.
pub const KEY_REQ: &[u8; 16] = b"MPA ID Req Frame";
/// Key of an MPA Reply frame.
pub const KEY_REP: &[u8; 16] = b"MPA ID Rep Frame";
/// Maximum private data length (`MPA_MAX_PRIVDATA`, RFC 5044 §7.1).
pub const MAX_PRIVATE_DATA: usize = 512;
/// Length of the fixed part of a Request/Reply frame.
pub const RR_HEADER_LEN: usize = 20;
/// IRD and ORD are 14-bit values in the RFC 6581 block.
pub const IRD_ORD_MASK: u16 = 0x3fff;
/// Length of the MPA length field.
pub const MPA_HDR_LEN: usize = 2;
/// Length of the MPA CRC field.
pub const MPA_CRC_LEN: usize = 4;

/// MPA flag bits (byte 16 of a Request/Reply frame).
pub mod flags {
    /// M: the sender wants to receive markers.
    pub const MARKERS: u8 = 0x80;
    /// C: the sender wants CRC.
    pub const CRC: u8 = 0x40;
    /// R: reject (Reply only).
    pub const REJECT: u8 = 0x20;
    /// H: enhanced connection setup (RFC 6581), IRD/ORD block present.
    pub const ENHANCED: u8 = 0x10;
    /// siw-private "GSO experimental" bit (`0x0800` of the 16-bit word); tolerated, never required.
    pub const GSO_EXP: u8 = 0x08;
    /// Reserved bits.
    pub const RESERVED: u8 = 0x07;
}

/// Errors while decoding or validating MPA frames.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MpaError {
    /// The 16-byte key is neither the Request nor the Reply key.
    #[error("bad MPA key")]
    BadKey,
    /// A Request key was expected and a Reply key was seen, or the reverse.
    #[error("unexpected MPA frame kind {0:?}")]
    UnexpectedKind(FrameKind),
    /// Revision other than 1 or 2.
    #[error("unsupported MPA revision {0}")]
    Revision(u8),
    /// Private data longer than 512 bytes.
    #[error("private data length {0} exceeds 512")]
    PrivateDataTooLong(usize),
    /// Rev 2 with H set but fewer than 4 private data bytes.
    #[error("enhanced MPA frame without IRD/ORD block")]
    MissingIrdOrd,
    /// A Request with the R flag set.
    #[error("reject flag in an MPA request")]
    RejectInRequest,
}

/// Request or Reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// "MPA ID Req Frame"
    Request,
    /// "MPA ID Rep Frame"
    Reply,
}

/// RFC 6581 IRD/ORD block with the peer-to-peer (RTR) control bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IrdOrd {
    /// Inbound RDMA Read queue depth (14 bits).
    pub ird: u16,
    /// Outbound RDMA Read queue depth (14 bits).
    pub ord: u16,
    /// A: peer-to-peer mode (RTR message required).
    pub peer_to_peer: bool,
    /// B: zero-length SEND may serve as RTR.
    pub send_rtr: bool,
    /// C: zero-length RDMA WRITE may serve as RTR.
    pub write_rtr: bool,
    /// D: zero-length RDMA READ may serve as RTR.
    pub read_rtr: bool,
}

impl IrdOrd {
    /// Encodes the 4-byte block.
    pub fn encode(&self) -> [u8; 4] {
        let mut ird = self.ird & IRD_ORD_MASK;
        if self.peer_to_peer {
            ird |= 0x8000;
        }
        if self.send_rtr {
            ird |= 0x4000;
        }
        let mut ord = self.ord & IRD_ORD_MASK;
        if self.write_rtr {
            ord |= 0x8000;
        }
        if self.read_rtr {
            ord |= 0x4000;
        }
        let i = ird.to_be_bytes();
        let o = ord.to_be_bytes();
        [i[0], i[1], o[0], o[1]]
    }

    /// Decodes the 4-byte block.
    pub fn decode(b: [u8; 4]) -> Self {
        let ird = u16::from_be_bytes([b[0], b[1]]);
        let ord = u16::from_be_bytes([b[2], b[3]]);
        Self {
            ird: ird & IRD_ORD_MASK,
            ord: ord & IRD_ORD_MASK,
            peer_to_peer: ird & 0x8000 != 0,
            send_rtr: ird & 0x4000 != 0,
            write_rtr: ord & 0x8000 != 0,
            read_rtr: ord & 0x4000 != 0,
        }
    }
}

/// An MPA Request or Reply frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpaFrame {
    /// Request or Reply.
    pub kind: FrameKind,
    /// M flag.
    pub markers: bool,
    /// C flag.
    pub crc: bool,
    /// R flag (Reply only).
    pub reject: bool,
    /// siw's GSO_EXP bit (0x08).
    pub gso_exp: bool,
    /// Reserved flag bits as received (0x07); sent as given.
    pub reserved: u8,
    /// Revision, 1 or 2.
    pub revision: u8,
    /// The RFC 6581 block; `Some` iff revision 2 with H set.
    pub ird_ord: Option<IrdOrd>,
    /// ULP private data (without the IRD/ORD block).
    pub private_data: Vec<u8>,
}

impl MpaFrame {
    /// A plain frame of the given kind and revision, no flags.
    pub fn new(kind: FrameKind, revision: u8) -> Self {
        Self {
            kind,
            markers: false,
            crc: false,
            reject: false,
            gso_exp: false,
            reserved: 0,
            revision,
            ird_ord: None,
            private_data: Vec::new(),
        }
    }

    /// Total encoded length.
    pub fn encoded_len(&self) -> usize {
        RR_HEADER_LEN + self.pd_len()
    }

    fn pd_len(&self) -> usize {
        self.private_data.len() + if self.ird_ord.is_some() { 4 } else { 0 }
    }

    /// Appends the encoded frame to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), MpaError> {
        if !(1..=2).contains(&self.revision) {
            return Err(MpaError::Revision(self.revision));
        }
        // The limit covers the whole private data field, IRD/ORD block included.
        if self.pd_len() > MAX_PRIVATE_DATA {
            return Err(MpaError::PrivateDataTooLong(self.pd_len()));
        }
        out.extend_from_slice(match self.kind {
            FrameKind::Request => KEY_REQ,
            FrameKind::Reply => KEY_REP,
        });
        let mut f = self.reserved & flags::RESERVED;
        if self.markers {
            f |= flags::MARKERS;
        }
        if self.crc {
            f |= flags::CRC;
        }
        if self.reject {
            f |= flags::REJECT;
        }
        if self.ird_ord.is_some() {
            f |= flags::ENHANCED;
        }
        if self.gso_exp {
            f |= flags::GSO_EXP;
        }
        out.push(f);
        out.push(self.revision);
        out.extend_from_slice(&(self.pd_len() as u16).to_be_bytes());
        if let Some(io) = &self.ird_ord {
            out.extend_from_slice(&io.encode());
        }
        out.extend_from_slice(&self.private_data);
        Ok(())
    }

    /// Encodes into a fresh vector.
    pub fn to_bytes(&self) -> Result<Vec<u8>, MpaError> {
        let mut v = Vec::with_capacity(self.encoded_len());
        self.encode(&mut v)?;
        Ok(v)
    }

    /// Incremental decode: `Ok(None)` if `buf` does not yet hold the whole
    /// frame, otherwise the frame and the number of bytes it used. The key is
    /// checked as soon as 16 bytes are present, so garbage fails fast.
    pub fn parse(buf: &[u8]) -> Result<Option<(MpaFrame, usize)>, MpaError> {
        let kind = if buf.len() >= 16 {
            if &buf[..16] == KEY_REQ {
                FrameKind::Request
            } else if &buf[..16] == KEY_REP {
                FrameKind::Reply
            } else {
                return Err(MpaError::BadKey);
            }
        } else {
            let n = buf.len();
            if buf != &KEY_REQ[..n] && buf != &KEY_REP[..n] {
                return Err(MpaError::BadKey);
            }
            return Ok(None);
        };
        if buf.len() < RR_HEADER_LEN {
            return Ok(None);
        }
        let f = buf[16];
        let revision = buf[17];
        let pd_len = u16::from_be_bytes([buf[18], buf[19]]) as usize;
        if !(1..=2).contains(&revision) {
            return Err(MpaError::Revision(revision));
        }
        if pd_len > MAX_PRIVATE_DATA {
            return Err(MpaError::PrivateDataTooLong(pd_len));
        }
        if buf.len() < RR_HEADER_LEN + pd_len {
            return Ok(None);
        }
        let pd = &buf[RR_HEADER_LEN..RR_HEADER_LEN + pd_len];
        // H only has meaning in revision 2; in revision 1 it is a reserved bit.
        let enhanced = revision == 2 && f & flags::ENHANCED != 0;
        let (ird_ord, private_data) = if enhanced {
            if pd.len() < 4 {
                return Err(MpaError::MissingIrdOrd);
            }
            (
                Some(IrdOrd::decode([pd[0], pd[1], pd[2], pd[3]])),
                pd[4..].to_vec(),
            )
        } else {
            (None, pd.to_vec())
        };
        let reject = f & flags::REJECT != 0;
        if reject && kind == FrameKind::Request {
            return Err(MpaError::RejectInRequest);
        }
        let mut reserved = f & flags::RESERVED;
        if revision == 1 {
            reserved |= f & flags::ENHANCED;
        }
        Ok(Some((
            MpaFrame {
                kind,
                markers: f & flags::MARKERS != 0,
                crc: f & flags::CRC != 0,
                reject,
                gso_exp: f & flags::GSO_EXP != 0,
                reserved: reserved & flags::RESERVED,
                revision,
                ird_ord,
                private_data,
            },
            RR_HEADER_LEN + pd_len,
        )))
    }
}

/// Local MPA policy, mirroring siw's module constants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpaConfig {
    /// Ask for CRC (siw `mpa_crc_required`, default false).
    pub crc_required: bool,
    /// Refuse CRC when not required (siw `mpa_crc_strict`, default false).
    pub crc_strict: bool,
    /// Revision to offer: 1 or 2 (siw default 2, enhanced setup).
    pub revision: u8,
    /// Local IRD (≤ [`MAX_IRD_ORD`]).
    pub ird: u16,
    /// Local ORD (≤ [`MAX_IRD_ORD`]).
    pub ord: u16,
    /// Request peer-to-peer mode (RTR) as initiator (siw `peer_to_peer`, default false).
    pub peer_to_peer: bool,
    /// Set siw's GSO_EXP bit in our frames.
    pub gso_exp: bool,
}

/// siw's per-QP IRD/ORD limit.
pub const MAX_IRD_ORD: u16 = 128;

impl Default for MpaConfig {
    fn default() -> Self {
        Self {
            crc_required: false,
            crc_strict: false,
            revision: 2,
            ird: 16,
            ord: 16,
            peer_to_peer: false,
            gso_exp: false,
        }
    }
}

/// The RTR message chosen in peer-to-peer mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rtr {
    /// Zero-length RDMA WRITE (preferred, as in siw).
    Write,
    /// Zero-length RDMA READ.
    Read,
}

/// Result of a successful negotiation, from the local point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// CRC in use (both directions).
    pub crc: bool,
    /// Revision in use.
    pub revision: u8,
    /// Enhanced (RFC 6581) setup took place.
    pub enhanced: bool,
    /// Local IRD: inbound Read Requests we accept outstanding.
    pub ird: u16,
    /// Local ORD: outbound Read Requests we may have outstanding.
    pub ord: u16,
    /// RTR message of peer-to-peer mode, if negotiated.
    pub rtr: Option<Rtr>,
    /// The peer set GSO_EXP.
    pub peer_gso_exp: bool,
}

/// Why a negotiation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum NegotiationError {
    /// The peer asks for markers, which this implementation (like siw) does not support.
    #[error("peer requires MPA markers")]
    Markers,
    /// CRC setting incompatible with local policy.
    #[error("CRC policy mismatch")]
    Crc,
    /// Enhanced setup requested but the reply is not revision 2 with H.
    #[error("reply lacks enhanced connection setup")]
    NotEnhanced,
    /// The responder's ORD exceeds what this side can serve.
    #[error("insufficient IRD")]
    InsufficientIrd,
    /// Peer-to-peer requested but no common RTR type.
    #[error("no matching RTR mode")]
    NoMatchingRtr,
    /// The peer rejected the connection.
    #[error("rejected by peer")]
    Rejected,
}

/// Builds the initiator's Request.
pub fn initiator_request(cfg: &MpaConfig, private_data: &[u8]) -> MpaFrame {
    let mut f = MpaFrame::new(FrameKind::Request, cfg.revision.clamp(1, 2));
    f.crc = cfg.crc_required;
    f.gso_exp = cfg.gso_exp;
    if f.revision == 2 {
        f.ird_ord = Some(IrdOrd {
            ird: cfg.ird.min(MAX_IRD_ORD),
            ord: cfg.ord.min(MAX_IRD_ORD),
            peer_to_peer: cfg.peer_to_peer,
            send_rtr: false,
            write_rtr: cfg.peer_to_peer,
            read_rtr: cfg.peer_to_peer,
        });
    }
    f.private_data = private_data.to_vec();
    f
}

/// Responder side: evaluates a Request. On success returns the negotiated
/// parameters (use [`responder_reply`] to build the accepting Reply); on
/// failure the caller sends [`reject_reply`].
///
/// CRC rule (RFC 5044 §7.1, siw `siw_proc_mpareq`): CRC is used if either
/// side sets C. A responder with `crc_strict && !crc_required` refuses a
/// Request with C set. Markers are always refused.
pub fn responder_evaluate(cfg: &MpaConfig, req: &MpaFrame) -> Result<Negotiated, NegotiationError> {
    if req.markers {
        return Err(NegotiationError::Markers);
    }
    if req.crc && cfg.crc_strict && !cfg.crc_required {
        return Err(NegotiationError::Crc);
    }
    let revision = req.revision.min(cfg.revision.clamp(1, 2));
    let (enhanced, ird, ord, rtr) = match (&req.ird_ord, revision) {
        (Some(p), 2) => {
            // Peer IRD bounds our ORD; our IRD must cover the peer's ORD
            // (relaxed negotiation: raise it up to the device limit).
            let ord = cfg.ord.min(p.ird).min(MAX_IRD_ORD);
            let ird = cfg.ird.max(p.ord).min(MAX_IRD_ORD);
            let rtr = if p.peer_to_peer {
                Some(if p.write_rtr {
                    Rtr::Write
                } else if p.read_rtr {
                    Rtr::Read
                } else {
                    Rtr::Write
                })
            } else {
                None
            };
            (true, ird, ord, rtr)
        }
        _ => (false, cfg.ird, cfg.ord, None),
    };
    Ok(Negotiated {
        crc: req.crc || cfg.crc_required,
        revision,
        enhanced,
        ird,
        ord,
        rtr,
        peer_gso_exp: req.gso_exp,
    })
}

/// Builds the accepting Reply for a negotiation done by [`responder_evaluate`].
pub fn responder_reply(cfg: &MpaConfig, n: &Negotiated, private_data: &[u8]) -> MpaFrame {
    let mut f = MpaFrame::new(FrameKind::Reply, n.revision);
    f.crc = n.crc;
    f.gso_exp = cfg.gso_exp;
    if n.enhanced {
        f.ird_ord = Some(IrdOrd {
            ird: n.ird,
            ord: n.ord,
            peer_to_peer: n.rtr.is_some(),
            send_rtr: false,
            write_rtr: n.rtr == Some(Rtr::Write),
            read_rtr: n.rtr == Some(Rtr::Read),
        });
    }
    f.private_data = private_data.to_vec();
    f
}

/// Builds a rejecting Reply (R set, M cleared), echoing the Request's
/// revision (at most 2) and carrying the given private data.
pub fn reject_reply(req: Option<&MpaFrame>, private_data: &[u8]) -> MpaFrame {
    let rev = req.map(|r| r.revision.clamp(1, 2)).unwrap_or(1);
    let mut f = MpaFrame::new(FrameKind::Reply, rev);
    f.reject = true;
    if rev == 2 && req.and_then(|r| r.ird_ord).is_some() {
        f.ird_ord = Some(IrdOrd::default());
    }
    f.private_data = private_data.to_vec();
    f
}

/// Initiator side: evaluates the Reply to the Request `req` we sent.
pub fn initiator_evaluate(
    cfg: &MpaConfig,
    req: &MpaFrame,
    rep: &MpaFrame,
) -> Result<Negotiated, NegotiationError> {
    if rep.reject {
        return Err(NegotiationError::Rejected);
    }
    if rep.markers {
        return Err(NegotiationError::Markers);
    }
    if (cfg.crc_required && !rep.crc) || (cfg.crc_strict && !cfg.crc_required && rep.crc) {
        return Err(NegotiationError::Crc);
    }
    let mut n = Negotiated {
        crc: rep.crc,
        revision: rep.revision,
        enhanced: false,
        ird: cfg.ird,
        ord: cfg.ord,
        rtr: None,
        peer_gso_exp: rep.gso_exp,
    };
    if let Some(mine) = req.ird_ord {
        let Some(theirs) = rep.ird_ord.filter(|_| rep.revision == 2) else {
            return Err(NegotiationError::NotEnhanced);
        };
        n.enhanced = true;
        if theirs.ord > MAX_IRD_ORD {
            return Err(NegotiationError::InsufficientIrd);
        }
        n.ird = theirs.ord.max(mine.ird.min(MAX_IRD_ORD));
        n.ord = theirs.ird.min(mine.ord);
        if mine.peer_to_peer {
            n.rtr = if mine.write_rtr && theirs.write_rtr {
                Some(Rtr::Write)
            } else if mine.read_rtr && theirs.read_rtr {
                Some(Rtr::Read)
            } else {
                return Err(NegotiationError::NoMatchingRtr);
            };
        }
    }
    Ok(n)
}

// ---------------------------------------------------------------------------
// FPDU framing
// ---------------------------------------------------------------------------

/// Pad length after `2 + ulpdu_len` bytes.
pub fn pad_len(ulpdu_len: usize) -> usize {
    (4 - ((MPA_HDR_LEN + ulpdu_len) & 3)) & 3
}

/// Total FPDU length on the wire for a ULPDU of `ulpdu_len` bytes.
pub fn fpdu_len(ulpdu_len: usize) -> usize {
    MPA_HDR_LEN + ulpdu_len + pad_len(ulpdu_len) + MPA_CRC_LEN
}

/// Largest ULPDU that fits in an FPDU of at most `fpdu` bytes.
pub fn max_ulpdu_for_fpdu(fpdu: usize) -> usize {
    (fpdu.saturating_sub(MPA_HDR_LEN + MPA_CRC_LEN) + MPA_HDR_LEN) / 4 * 4 - MPA_HDR_LEN
}

/// Appends one FPDU whose ULPDU is `hdr` followed by `payload`.
///
/// # Panics
/// If the ULPDU is longer than 65535 bytes.
pub fn write_fpdu(out: &mut Vec<u8>, hdr: &[u8], payload: &[u8], crc: bool) {
    let ulen = hdr.len() + payload.len();
    assert!(ulen <= u16::MAX as usize, "ULPDU too long");
    let start = out.len();
    out.extend_from_slice(&(ulen as u16).to_be_bytes());
    out.extend_from_slice(hdr);
    out.extend_from_slice(payload);
    out.extend_from_slice(&[0u8; 3][..pad_len(ulen)]);
    let c = if crc {
        crc32c::crc32c(&out[start..])
    } else {
        0
    };
    out.extend_from_slice(&c.to_le_bytes());
}

/// Errors of the FPDU deframer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum FrameError {
    /// ULPDU_Length above the configured maximum.
    #[error("FPDU ULPDU length {len} exceeds maximum {max}")]
    TooLong {
        /// Received ULPDU_Length.
        len: usize,
        /// Configured maximum.
        max: usize,
    },
    /// CRC mismatch.
    #[error("MPA CRC mismatch: received {received:#010x}, computed {computed:#010x}")]
    Crc {
        /// CRC from the wire (as the LE value).
        received: u32,
        /// CRC computed locally.
        computed: u32,
    },
}

/// Incremental FPDU deframer: feed arbitrary TCP segments with
/// [`push`](Self::push), take complete, CRC-checked ULPDUs with
/// [`next_ulpdu`](Self::next_ulpdu).
#[derive(Debug)]
pub struct Deframer {
    buf: Vec<u8>,
    start: usize,
    crc: bool,
    max_ulpdu: usize,
    failed: bool,
}

impl Deframer {
    /// New deframer; `crc` enables CRC verification; `max_ulpdu` bounds
    /// ULPDU_Length (at most 65535 anyway).
    pub fn new(crc: bool, max_ulpdu: usize) -> Self {
        Self {
            buf: Vec::new(),
            start: 0,
            crc,
            max_ulpdu: max_ulpdu.min(u16::MAX as usize),
            failed: false,
        }
    }

    /// Appends stream bytes.
    pub fn push(&mut self, data: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > 64 * 1024 && self.start * 2 > self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// Bytes buffered but not yet returned.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Returns the next complete ULPDU (without length, pad and CRC), `None`
    /// if more bytes are needed. After an error the deframer stays failed
    /// (the stream cannot be resynchronised without markers).
    pub fn next_ulpdu(&mut self) -> Result<Option<&[u8]>, FrameError> {
        if self.failed {
            return Ok(None);
        }
        let avail = &self.buf[self.start..];
        if avail.len() < MPA_HDR_LEN {
            return Ok(None);
        }
        let ulen = u16::from_be_bytes([avail[0], avail[1]]) as usize;
        if ulen > self.max_ulpdu {
            self.failed = true;
            return Err(FrameError::TooLong {
                len: ulen,
                max: self.max_ulpdu,
            });
        }
        let total = fpdu_len(ulen);
        if avail.len() < total {
            return Ok(None);
        }
        let body = total - MPA_CRC_LEN;
        if self.crc {
            let received = u32::from_le_bytes(avail[body..total].try_into().expect("4 bytes"));
            let computed = crc32c::crc32c(&avail[..body]);
            if received != computed {
                self.failed = true;
                return Err(FrameError::Crc { received, computed });
            }
        }
        let s = self.start;
        self.start += total;
        Ok(Some(&self.buf[s + MPA_HDR_LEN..s + MPA_HDR_LEN + ulen]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_byte_order_matches_iscsi_vector() {
        // RFC 3720 B.4: 32 bytes of zeros -> aa 36 91 8a on the wire.
        assert_eq!(
            crc32c::crc32c(&[0u8; 32]).to_le_bytes(),
            [0xaa, 0x36, 0x91, 0x8a]
        );
    }

    #[test]
    fn pad_and_len() {
        assert_eq!(fpdu_len(2), 8);
        assert_eq!(fpdu_len(14), 20);
        assert_eq!(fpdu_len(18), 24);
        assert_eq!(fpdu_len(15), 24);
        for f in 8..200 {
            let u = max_ulpdu_for_fpdu(f);
            assert!(fpdu_len(u) <= f);
            assert!(fpdu_len(u + 1) > f || fpdu_len(u + 4) > f);
        }
    }

    #[test]
    fn responder_refuses_markers_and_strict_crc() {
        let mut req = initiator_request(&MpaConfig::default(), b"x");
        req.markers = true;
        assert_eq!(
            responder_evaluate(&MpaConfig::default(), &req),
            Err(NegotiationError::Markers)
        );
        req.markers = false;
        req.crc = true;
        let strict = MpaConfig {
            crc_strict: true,
            ..MpaConfig::default()
        };
        assert_eq!(
            responder_evaluate(&strict, &req),
            Err(NegotiationError::Crc)
        );
        let n = responder_evaluate(&MpaConfig::default(), &req).unwrap();
        assert!(n.crc);
    }

    #[test]
    fn crc_on_if_either_side_sets_c() {
        for (ic, rc) in [(false, false), (true, false), (false, true), (true, true)] {
            let icfg = MpaConfig {
                crc_required: ic,
                ..MpaConfig::default()
            };
            let rcfg = MpaConfig {
                crc_required: rc,
                ..MpaConfig::default()
            };
            let req = initiator_request(&icfg, b"");
            let rn = responder_evaluate(&rcfg, &req).unwrap();
            let rep = responder_reply(&rcfg, &rn, b"");
            let inn = initiator_evaluate(&icfg, &req, &rep).unwrap();
            assert_eq!(rn.crc, ic || rc);
            assert_eq!(inn.crc, ic || rc);
        }
    }

    #[test]
    fn ird_ord_and_rtr() {
        let icfg = MpaConfig {
            ird: 4,
            ord: 8,
            peer_to_peer: true,
            ..MpaConfig::default()
        };
        let rcfg = MpaConfig {
            ird: 2,
            ord: 2,
            ..MpaConfig::default()
        };
        let req = initiator_request(&icfg, b"");
        let rn = responder_evaluate(&rcfg, &req).unwrap();
        assert_eq!((rn.ird, rn.ord, rn.rtr), (8, 2, Some(Rtr::Write)));
        let rep = responder_reply(&rcfg, &rn, b"");
        let n = initiator_evaluate(&icfg, &req, &rep).unwrap();
        assert_eq!((n.ird, n.ord, n.rtr), (4, 8, Some(Rtr::Write)));
    }

    #[test]
    fn rev1_peer_falls_back() {
        let icfg = MpaConfig {
            revision: 1,
            ..MpaConfig::default()
        };
        let req = initiator_request(&icfg, b"abc");
        assert!(req.ird_ord.is_none());
        let rn = responder_evaluate(&MpaConfig::default(), &req).unwrap();
        assert_eq!(rn.revision, 1);
        let rep = responder_reply(&MpaConfig::default(), &rn, b"");
        assert_eq!(rep.revision, 1);
        assert!(rep.ird_ord.is_none());
        initiator_evaluate(&icfg, &req, &rep).unwrap();
    }
}
