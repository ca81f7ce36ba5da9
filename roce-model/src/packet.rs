//! Whole transport packets: BTH, extension headers, payload, pad and ICRC.
//!
//! [`RocePacket::parse`] takes the bytes after the UDP header (RoCEv2), after
//! the GRH (RoCEv1) or after the LRH/GRH (native IB): BTH .. ICRC.
//! [`PacketBuilder`] emits the same region.

use crate::error::{CodecError, Result};
use crate::headers::{Aeth, AtomicAckEth, AtomicEth, Bth, Deth, Feth, Header, Ieth, ImmDt, Reth};
use crate::icrc::{IcrcScope, ICRC_LEN};
use crate::opcode::{HeaderSet, Opcode, OpcodeInfo};

/// Extension headers present in a packet (which ones is fixed by the opcode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExtHeaders {
    /// DETH (UD).
    pub deth: Option<Deth>,
    /// FETH (FLUSH).
    pub feth: Option<Feth>,
    /// RETH (WRITE FIRST/ONLY, READ request, FLUSH, ATOMIC_WRITE).
    pub reth: Option<Reth>,
    /// AtomicETH (COMPARE_SWAP, FETCH_ADD).
    pub atomic_eth: Option<AtomicEth>,
    /// Immediate data.
    pub imm_dt: Option<ImmDt>,
    /// IETH (SEND with invalidate).
    pub ieth: Option<Ieth>,
    /// AETH (ACK, READ responses except MIDDLE, ATOMIC ACK).
    pub aeth: Option<Aeth>,
    /// AtomicAckETH (ATOMIC ACK).
    pub atomic_ack_eth: Option<AtomicAckEth>,
}

impl ExtHeaders {
    /// The set of headers present.
    pub fn present(&self) -> HeaderSet {
        let mut s = HeaderSet::NONE;
        let flags = [
            (self.deth.is_some(), HeaderSet::DETH),
            (self.feth.is_some(), HeaderSet::FETH),
            (self.reth.is_some(), HeaderSet::RETH),
            (self.atomic_eth.is_some(), HeaderSet::ATOMIC_ETH),
            (self.imm_dt.is_some(), HeaderSet::IMM_DT),
            (self.ieth.is_some(), HeaderSet::IETH),
            (self.aeth.is_some(), HeaderSet::AETH),
            (self.atomic_ack_eth.is_some(), HeaderSet::ATOMIC_ACK_ETH),
        ];
        for (p, h) in flags {
            if p {
                s = s.with(h);
            }
        }
        s
    }

    /// Parse the headers in `set` from `buf` (which starts right after the BTH).
    pub fn parse(set: HeaderSet, buf: &[u8]) -> Result<(ExtHeaders, usize)> {
        fn take<H: Header>(
            set: HeaderSet,
            bit: HeaderSet,
            buf: &[u8],
            off: &mut usize,
        ) -> Result<Option<H>> {
            if !set.contains(bit) {
                return Ok(None);
            }
            let h = H::parse(buf.get(*off..).unwrap_or(&[]))?;
            *off += H::LEN;
            Ok(Some(h))
        }
        let mut off = 0;
        let e = ExtHeaders {
            deth: take(set, HeaderSet::DETH, buf, &mut off)?,
            feth: take(set, HeaderSet::FETH, buf, &mut off)?,
            reth: take(set, HeaderSet::RETH, buf, &mut off)?,
            atomic_eth: take(set, HeaderSet::ATOMIC_ETH, buf, &mut off)?,
            imm_dt: take(set, HeaderSet::IMM_DT, buf, &mut off)?,
            ieth: take(set, HeaderSet::IETH, buf, &mut off)?,
            aeth: take(set, HeaderSet::AETH, buf, &mut off)?,
            atomic_ack_eth: take(set, HeaderSet::ATOMIC_ACK_ETH, buf, &mut off)?,
        };
        Ok((e, off))
    }

    /// Emit all present headers in wire order into `buf`; returns bytes written.
    pub fn write(&self, buf: &mut [u8]) -> Result<usize> {
        fn put<H: Header>(h: &Option<H>, buf: &mut [u8], off: &mut usize) -> Result<()> {
            if let Some(h) = h {
                let have = buf.len();
                let dst = buf.get_mut(*off..).ok_or(CodecError::BufferTooSmall {
                    need: *off + H::LEN,
                    have,
                })?;
                h.write(dst)?;
                *off += H::LEN;
            }
            Ok(())
        }
        let mut off = 0;
        put(&self.deth, buf, &mut off)?;
        put(&self.feth, buf, &mut off)?;
        put(&self.reth, buf, &mut off)?;
        put(&self.atomic_eth, buf, &mut off)?;
        put(&self.imm_dt, buf, &mut off)?;
        put(&self.ieth, buf, &mut off)?;
        put(&self.aeth, buf, &mut off)?;
        put(&self.atomic_ack_eth, buf, &mut off)?;
        Ok(off)
    }

    /// Check that exactly the headers `opcode` requires are present.
    pub fn check_for(&self, opcode: Opcode) -> Result<()> {
        let want = opcode.info().headers;
        let have = self.present();
        for (bit, _, name) in HeaderSet::ORDER {
            match (want.contains(bit), have.contains(bit)) {
                (true, false) => {
                    return Err(CodecError::MissingHeader {
                        opcode: opcode.as_u8(),
                        header: name,
                    })
                }
                (false, true) => {
                    return Err(CodecError::UnexpectedHeader {
                        opcode: opcode.as_u8(),
                        header: name,
                    })
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// A parsed transport packet borrowing from the receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RocePacket<'a> {
    /// Base transport header.
    pub bth: Bth,
    /// Extension headers (as required by `bth.opcode`).
    pub ext: ExtHeaders,
    /// Payload (without pad).
    pub payload: &'a [u8],
    /// Pad bytes (`bth.pad_cnt` of them; normally zero, not checked).
    pub pad: &'a [u8],
    /// ICRC exactly as on the wire.
    pub icrc: [u8; 4],
    /// The whole BTH..ICRC region that was parsed.
    pub raw: &'a [u8],
}

impl<'a> RocePacket<'a> {
    /// Parse BTH .. ICRC.
    ///
    /// Checks structure only: known opcode, TVer 0, headers present, pad fits,
    /// payload+pad a multiple of 4, fixed payload sizes (no payload for ACK /
    /// READ request / atomics / FLUSH, 8 for ATOMIC_WRITE, 16 for CNP). PMTU
    /// rules are left to the engine ([`crate::PayloadRule::check`]); the ICRC
    /// is checked by [`RocePacket::verify_icrc`].
    pub fn parse(buf: &'a [u8]) -> Result<RocePacket<'a>> {
        let bth = Bth::parse(buf)?;
        if bth.tver != 0 {
            return Err(CodecError::BadTver(bth.tver));
        }
        let info = bth.opcode.info();
        let hdr_len = Bth::LEN + info.ext_len();
        if buf.len() < hdr_len + ICRC_LEN {
            return Err(CodecError::Truncated {
                what: "packet",
                need: hdr_len + ICRC_LEN,
                have: buf.len(),
            });
        }
        let (ext, n) = ExtHeaders::parse(info.headers, &buf[Bth::LEN..])?;
        debug_assert_eq!(n, info.ext_len());
        let icrc_at = buf.len() - ICRC_LEN;
        let body = &buf[hdr_len..icrc_at];
        let pad = usize::from(bth.pad_cnt);
        if pad > body.len() {
            return Err(CodecError::BadPad {
                pad: bth.pad_cnt,
                avail: body.len(),
            });
        }
        if body.len() & 3 != 0 {
            return Err(CodecError::Misaligned(body.len()));
        }
        let (payload, pad_bytes) = body.split_at(body.len() - pad);
        if let Some(n) = info.payload.fixed_len() {
            if payload.len() != n {
                return Err(CodecError::PayloadLength {
                    opcode: bth.opcode.as_u8(),
                    expected: n,
                    actual: payload.len(),
                });
            }
        }
        let t = &buf[icrc_at..];
        Ok(RocePacket {
            bth,
            ext,
            payload,
            pad: pad_bytes,
            icrc: [t[0], t[1], t[2], t[3]],
            raw: buf,
        })
    }

    /// Static info of the packet's opcode.
    pub fn info(&self) -> OpcodeInfo {
        self.bth.opcode.info()
    }

    /// The ICRC as a number (little-endian read of the wire bytes).
    pub fn icrc_value(&self) -> u32 {
        u32::from_le_bytes(self.icrc)
    }

    /// Verify the ICRC given what preceded the BTH.
    pub fn verify_icrc(&self, scope: &IcrcScope<'_>) -> Result<()> {
        scope.verify(self.raw)
    }

    /// A builder that reproduces this packet (same BTH flags, headers, payload).
    pub fn to_builder(&self) -> PacketBuilder<'a> {
        PacketBuilder {
            bth: self.bth,
            ext: self.ext,
            payload: self.payload,
        }
    }
}

/// Builds a BTH .. ICRC byte vector.
///
/// ```
/// use roce_model::{PacketBuilder, Opcode, Aeth, AethSyndrome, IcrcScope, RocePacket};
/// let ack = PacketBuilder::new(Opcode::RcAcknowledge, 0x11, 42)
///     .aeth(Aeth { syndrome: AethSyndrome::Ack { credits: 31 }, msn: 7 });
/// let grh = [0x60u8; 40];
/// let bytes = ack.build(&IcrcScope::Grh(&grh)).unwrap();
/// let p = RocePacket::parse(&bytes).unwrap();
/// assert_eq!(p.ext.aeth.unwrap().msn, 7);
/// p.verify_icrc(&IcrcScope::Grh(&grh)).unwrap();
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketBuilder<'a> {
    /// BTH; `pad_cnt` is recomputed from the payload by the builder.
    pub bth: Bth,
    /// Extension headers; must match the opcode exactly.
    pub ext: ExtHeaders,
    /// Payload (the builder adds the pad).
    pub payload: &'a [u8],
}

impl<'a> PacketBuilder<'a> {
    /// Start a packet with P_Key 0xFFFF, no flags, no headers, empty payload.
    pub fn new(opcode: Opcode, dest_qp: u32, psn: u32) -> Self {
        PacketBuilder {
            bth: Bth::new(opcode, dest_qp, psn),
            ext: ExtHeaders::default(),
            payload: &[],
        }
    }
    /// Set AckReq.
    pub fn ack_req(mut self, v: bool) -> Self {
        self.bth.ack_req = v;
        self
    }
    /// Set the solicited-event bit.
    pub fn se(mut self, v: bool) -> Self {
        self.bth.se = v;
        self
    }
    /// Set MigReq.
    pub fn mig(mut self, v: bool) -> Self {
        self.bth.mig = v;
        self
    }
    /// Set the P_Key.
    pub fn pkey(mut self, v: u16) -> Self {
        self.bth.pkey = v;
        self
    }
    /// Set FECN / BECN.
    pub fn ecn(mut self, fecn: bool, becn: bool) -> Self {
        self.bth.fecn = fecn;
        self.bth.becn = becn;
        self
    }
    /// Add a RETH.
    pub fn reth(mut self, h: Reth) -> Self {
        self.ext.reth = Some(h);
        self
    }
    /// Add an AETH.
    pub fn aeth(mut self, h: Aeth) -> Self {
        self.ext.aeth = Some(h);
        self
    }
    /// Add an AtomicETH.
    pub fn atomic_eth(mut self, h: AtomicEth) -> Self {
        self.ext.atomic_eth = Some(h);
        self
    }
    /// Add an AtomicAckETH.
    pub fn atomic_ack_eth(mut self, h: AtomicAckEth) -> Self {
        self.ext.atomic_ack_eth = Some(h);
        self
    }
    /// Add immediate data.
    pub fn imm(mut self, imm: u32) -> Self {
        self.ext.imm_dt = Some(ImmDt { imm });
        self
    }
    /// Add an IETH.
    pub fn ieth(mut self, rkey: u32) -> Self {
        self.ext.ieth = Some(Ieth { rkey });
        self
    }
    /// Add a DETH.
    pub fn deth(mut self, h: Deth) -> Self {
        self.ext.deth = Some(h);
        self
    }
    /// Add a FETH.
    pub fn feth(mut self, h: Feth) -> Self {
        self.ext.feth = Some(h);
        self
    }
    /// Set the payload.
    pub fn payload(mut self, p: &'a [u8]) -> Self {
        self.payload = p;
        self
    }

    /// Pad count for the current payload: `(-len) & 3`.
    pub fn pad_cnt(&self) -> u8 {
        (self.payload.len().wrapping_neg() & 3) as u8
    }

    /// Length of the emitted BTH..ICRC region.
    pub fn wire_len(&self) -> usize {
        Bth::LEN
            + self.bth.opcode.info().ext_len()
            + self.payload.len()
            + usize::from(self.pad_cnt())
            + ICRC_LEN
    }

    /// Emit BTH .. pad followed by a zero ICRC placeholder, after validating
    /// headers and fixed payload sizes. Seal it with [`IcrcScope::seal`].
    pub fn build_unsealed(&self) -> Result<Vec<u8>> {
        let op = self.bth.opcode;
        let info = op.info();
        self.ext.check_for(op)?;
        if let Some(n) = info.payload.fixed_len() {
            if self.payload.len() != n {
                return Err(CodecError::PayloadLength {
                    opcode: op.as_u8(),
                    expected: n,
                    actual: self.payload.len(),
                });
            }
        }
        let mut out = vec![0u8; self.wire_len()];
        let mut bth = self.bth;
        bth.pad_cnt = self.pad_cnt();
        bth.write(&mut out)?;
        let n = self.ext.write(&mut out[Bth::LEN..])?;
        let p = Bth::LEN + n;
        out[p..p + self.payload.len()].copy_from_slice(self.payload);
        Ok(out)
    }

    /// Emit the complete BTH .. ICRC region, ICRC computed for `scope`.
    pub fn build(&self, scope: &IcrcScope<'_>) -> Result<Vec<u8>> {
        let mut out = self.build_unsealed()?;
        scope.seal(&mut out)?;
        Ok(out)
    }
}
