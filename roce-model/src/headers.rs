//! Base and extended transport headers (IBA 9.2 / 9.3), all big-endian.
//!
//! Every header has a fixed `LEN`, a `parse` that reads from the start of a
//! byte slice and a `write` that emits into the start of a mutable slice.
//! Reserved bits are ignored on parse and written as zero.

#[cfg(test)]
use crate::error::CodecError;
use crate::error::{check_bits, need, need_mut, Result};
use crate::opcode::Opcode;

#[inline]
fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}
#[inline]
fn be24(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([0, b[o], b[o + 1], b[o + 2]])
}
#[inline]
fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
#[inline]
fn be64(b: &[u8], o: usize) -> u64 {
    (u64::from(be32(b, o)) << 32) | u64::from(be32(b, o + 4))
}
#[inline]
fn put24(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}

/// Common interface of the fixed-size headers.
pub trait Header: Sized {
    /// Size on the wire in bytes.
    const LEN: usize;
    /// Header name for error messages.
    const NAME: &'static str;
    /// Parse from the start of `buf`.
    fn parse(buf: &[u8]) -> Result<Self>;
    /// Emit into the start of `buf`; fails if `buf` is short or a field overflows its width.
    fn write(&self, buf: &mut [u8]) -> Result<()>;
    /// Emit into a fresh vector.
    fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![0; Self::LEN];
        self.write(&mut v)?;
        Ok(v)
    }
}

/// Base Transport Header, 12 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bth {
    /// Opcode (byte 0).
    pub opcode: Opcode,
    /// Solicited event.
    pub se: bool,
    /// Migration request (MigReq).
    pub mig: bool,
    /// Pad count, 0..=3: bytes between payload and ICRC.
    pub pad_cnt: u8,
    /// Transport header version, 4 bits, must be 0.
    pub tver: u8,
    /// Partition key (rxe: always 0xFFFF).
    pub pkey: u16,
    /// Forward ECN (byte 4 bit 7; masked out of the ICRC).
    pub fecn: bool,
    /// Backward ECN (byte 4 bit 6; masked out of the ICRC).
    pub becn: bool,
    /// Destination QP, 24 bits.
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number, 24 bits.
    pub psn: u32,
}

impl Bth {
    /// A BTH with the given opcode, QP and PSN, P_Key 0xFFFF and all flags clear.
    pub const fn new(opcode: Opcode, dest_qp: u32, psn: u32) -> Bth {
        Bth {
            opcode,
            se: false,
            mig: false,
            pad_cnt: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }
}

impl Header for Bth {
    const LEN: usize = 12;
    const NAME: &'static str = "BTH";

    fn parse(buf: &[u8]) -> Result<Self> {
        let b = need(buf, Self::LEN, Self::NAME)?;
        Ok(Bth {
            opcode: Opcode::try_from(b[0])?,
            se: b[1] & 0x80 != 0,
            mig: b[1] & 0x40 != 0,
            pad_cnt: (b[1] >> 4) & 3,
            tver: b[1] & 0x0f,
            pkey: be16(b, 2),
            fecn: b[4] & 0x80 != 0,
            becn: b[4] & 0x40 != 0,
            dest_qp: be24(b, 5),
            ack_req: b[8] & 0x80 != 0,
            psn: be24(b, 9),
        })
    }

    fn write(&self, buf: &mut [u8]) -> Result<()> {
        check_bits("BTH.pad_cnt", self.pad_cnt.into(), 2)?;
        check_bits("BTH.tver", self.tver.into(), 4)?;
        check_bits("BTH.dest_qp", self.dest_qp.into(), 24)?;
        check_bits("BTH.psn", self.psn.into(), 24)?;
        let b = need_mut(buf, Self::LEN)?;
        b[0] = self.opcode.as_u8();
        b[1] =
            (u8::from(self.se) << 7) | (u8::from(self.mig) << 6) | (self.pad_cnt << 4) | self.tver;
        b[2..4].copy_from_slice(&self.pkey.to_be_bytes());
        b[4] = (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6);
        put24(b, 5, self.dest_qp);
        b[8] = u8::from(self.ack_req) << 7;
        put24(b, 9, self.psn);
        Ok(())
    }
}

/// RDMA Extended Transport Header, 16 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Reth {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length of the whole message.
    pub len: u32,
}

impl Header for Reth {
    const LEN: usize = 16;
    const NAME: &'static str = "RETH";
    fn parse(buf: &[u8]) -> Result<Self> {
        let b = need(buf, Self::LEN, Self::NAME)?;
        Ok(Reth {
            va: be64(b, 0),
            rkey: be32(b, 8),
            len: be32(b, 12),
        })
    }
    fn write(&self, buf: &mut [u8]) -> Result<()> {
        let b = need_mut(buf, Self::LEN)?;
        b[0..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
        Ok(())
    }
}

/// NAK codes carried in an AETH NAK syndrome (bits 4:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error (syndrome 0x60).
    PsnSequenceError,
    /// 1: invalid request (0x61).
    InvalidRequest,
    /// 2: remote access error (0x62).
    RemoteAccessError,
    /// 3: remote operational error (0x63).
    RemoteOperationalError,
    /// 4: invalid RD request (0x64).
    InvalidRdRequest,
    /// 5..=31: reserved values, kept verbatim.
    Reserved(u8),
}

impl NakCode {
    /// Decode the 5-bit code.
    pub const fn from_bits(v: u8) -> NakCode {
        match v & 0x1f {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            x => NakCode::Reserved(x),
        }
    }
    /// Encode as the 5-bit code.
    pub const fn bits(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(x) => x & 0x1f,
        }
    }
}

/// AETH syndrome (byte 0 of the AETH). Bit 7 is reserved and ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethSyndrome {
    /// Type `00`: ACK with a 5-bit credit code (31 = unlimited/invalid; rxe always sends 31).
    Ack {
        /// Credit code 0..=31.
        credits: u8,
    },
    /// Type `01`: RNR NAK with a 5-bit timer code (see [`rnr_timer_usec`]).
    RnrNak {
        /// RNR timer code 0..=31.
        timer: u8,
    },
    /// Type `11`: NAK.
    Nak {
        /// NAK code.
        code: NakCode,
    },
    /// Type `10`: reserved; low 5 bits kept verbatim.
    Reserved {
        /// Low 5 bits.
        value: u8,
    },
}

impl AethSyndrome {
    /// Credit code meaning "unlimited / invalid credits".
    pub const CREDITS_INVALID: u8 = 0x1f;

    /// Decode a syndrome byte.
    pub const fn from_byte(b: u8) -> AethSyndrome {
        let low = b & 0x1f;
        match (b >> 5) & 3 {
            0 => AethSyndrome::Ack { credits: low },
            1 => AethSyndrome::RnrNak { timer: low },
            2 => AethSyndrome::Reserved { value: low },
            _ => AethSyndrome::Nak {
                code: NakCode::from_bits(low),
            },
        }
    }

    /// Encode as a syndrome byte (values above 31 are masked to 5 bits).
    pub const fn to_byte(self) -> u8 {
        match self {
            AethSyndrome::Ack { credits } => credits & 0x1f,
            AethSyndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            AethSyndrome::Reserved { value } => 0x40 | (value & 0x1f),
            AethSyndrome::Nak { code } => 0x60 | code.bits(),
        }
    }

    /// Is this a positive acknowledgement?
    pub const fn is_ack(self) -> bool {
        matches!(self, AethSyndrome::Ack { .. })
    }
}

/// ACK Extended Transport Header, 4 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Aeth {
    /// Syndrome.
    pub syndrome: AethSyndrome,
    /// Message sequence number, 24 bits.
    pub msn: u32,
}

impl Header for Aeth {
    const LEN: usize = 4;
    const NAME: &'static str = "AETH";
    fn parse(buf: &[u8]) -> Result<Self> {
        let b = need(buf, Self::LEN, Self::NAME)?;
        Ok(Aeth {
            syndrome: AethSyndrome::from_byte(b[0]),
            msn: be24(b, 1),
        })
    }
    fn write(&self, buf: &mut [u8]) -> Result<()> {
        check_bits("AETH.msn", self.msn.into(), 24)?;
        let b = need_mut(buf, Self::LEN)?;
        b[0] = self.syndrome.to_byte();
        put24(b, 1, self.msn);
        Ok(())
    }
}

/// Atomic Extended Transport Header, 28 bytes (packed, so the u64s are unaligned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicEth {
    /// Remote virtual address (8-byte aligned for a valid request).
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value (COMPARE_SWAP) or add value (FETCH_ADD).
    pub swap_add: u64,
    /// Compare value (COMPARE_SWAP only).
    pub compare: u64,
}

impl Header for AtomicEth {
    const LEN: usize = 28;
    const NAME: &'static str = "AtomicETH";
    fn parse(buf: &[u8]) -> Result<Self> {
        let b = need(buf, Self::LEN, Self::NAME)?;
        Ok(AtomicEth {
            va: be64(b, 0),
            rkey: be32(b, 8),
            swap_add: be64(b, 12),
            compare: be64(b, 20),
        })
    }
    fn write(&self, buf: &mut [u8]) -> Result<()> {
        let b = need_mut(buf, Self::LEN)?;
        b[0..8].copy_from_slice(&self.va.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..20].copy_from_slice(&self.swap_add.to_be_bytes());
        b[20..28].copy_from_slice(&self.compare.to_be_bytes());
        Ok(())
    }
}

/// Atomic ACK Extended Transport Header, 8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicAckEth {
    /// Original remote value before the atomic operation.
    pub orig: u64,
}

impl Header for AtomicAckEth {
    const LEN: usize = 8;
    const NAME: &'static str = "AtomicAckETH";
    fn parse(buf: &[u8]) -> Result<Self> {
        let b = need(buf, Self::LEN, Self::NAME)?;
        Ok(AtomicAckEth { orig: be64(b, 0) })
    }
    fn write(&self, buf: &mut [u8]) -> Result<()> {
        let b = need_mut(buf, Self::LEN)?;
        b.copy_from_slice(&self.orig.to_be_bytes());
        Ok(())
    }
}

/// Immediate data, 4 bytes. The value is the big-endian reading of the wire
/// bytes; verbs pass it through opaquely (`__be32`), so
/// `imm.to_be_bytes()` are the bytes the application supplied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ImmDt {
    /// Immediate value.
    pub imm: u32,
}

impl Header for ImmDt {
    const LEN: usize = 4;
    const NAME: &'static str = "ImmDt";
    fn parse(buf: &[u8]) -> Result<Self> {
        let b = need(buf, Self::LEN, Self::NAME)?;
        Ok(ImmDt { imm: be32(b, 0) })
    }
    fn write(&self, buf: &mut [u8]) -> Result<()> {
        let b = need_mut(buf, Self::LEN)?;
        b.copy_from_slice(&self.imm.to_be_bytes());
        Ok(())
    }
}

/// Invalidate Extended Transport Header, 4 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ieth {
    /// R_Key to invalidate.
    pub rkey: u32,
}

impl Header for Ieth {
    const LEN: usize = 4;
    const NAME: &'static str = "IETH";
    fn parse(buf: &[u8]) -> Result<Self> {
        let b = need(buf, Self::LEN, Self::NAME)?;
        Ok(Ieth { rkey: be32(b, 0) })
    }
    fn write(&self, buf: &mut [u8]) -> Result<()> {
        let b = need_mut(buf, Self::LEN)?;
        b.copy_from_slice(&self.rkey.to_be_bytes());
        Ok(())
    }
}

/// Datagram Extended Transport Header (UD), 8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Deth {
    /// Queue key (GSI uses 0x8001_0000).
    pub qkey: u32,
    /// Source QP, 24 bits.
    pub src_qp: u32,
}

impl Deth {
    /// Well-known Q_Key of the GSI (QP1).
    pub const GSI_QKEY: u32 = 0x8001_0000;
}

impl Header for Deth {
    const LEN: usize = 8;
    const NAME: &'static str = "DETH";
    fn parse(buf: &[u8]) -> Result<Self> {
        let b = need(buf, Self::LEN, Self::NAME)?;
        Ok(Deth {
            qkey: be32(b, 0),
            src_qp: be24(b, 5),
        })
    }
    fn write(&self, buf: &mut [u8]) -> Result<()> {
        check_bits("DETH.src_qp", self.src_qp.into(), 24)?;
        let b = need_mut(buf, Self::LEN)?;
        b[0..4].copy_from_slice(&self.qkey.to_be_bytes());
        b[4] = 0;
        put24(b, 5, self.src_qp);
        Ok(())
    }
}

/// Flush Extended Transport Header (IBA 1.5), 4 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Feth {
    /// Placement type, bits 3:0 (1 = global visibility, 2 = persistence).
    pub placement_type: u8,
    /// Selectivity level, bits 5:4 (0 = memory region range, 1 = whole MR).
    pub selectivity: u8,
}

impl Header for Feth {
    const LEN: usize = 4;
    const NAME: &'static str = "FETH";
    fn parse(buf: &[u8]) -> Result<Self> {
        let b = need(buf, Self::LEN, Self::NAME)?;
        let v = be32(b, 0);
        Ok(Feth {
            placement_type: (v & 0xf) as u8,
            selectivity: ((v >> 4) & 3) as u8,
        })
    }
    fn write(&self, buf: &mut [u8]) -> Result<()> {
        check_bits("FETH.placement_type", self.placement_type.into(), 4)?;
        check_bits("FETH.selectivity", self.selectivity.into(), 2)?;
        let b = need_mut(buf, Self::LEN)?;
        let v = u32::from(self.placement_type) | (u32::from(self.selectivity) << 4);
        b.copy_from_slice(&v.to_be_bytes());
        Ok(())
    }
}

/// Decode an ACK credit code into a credit count (`None` for 31 = unlimited/invalid).
pub const fn credit_count(code: u8) -> Option<u32> {
    const T: [u32; 31] = [
        0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
        2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
    ];
    if (code as usize) < T.len() {
        Some(T[code as usize])
    } else {
        None
    }
}

/// RNR NAK timer code to microseconds (IBA values; rxe's table has 61410 µs at code 25
/// where IBA says 61440). Codes above 31 are masked to 5 bits.
pub const fn rnr_timer_usec(code: u8) -> u32 {
    const T: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    T[(code & 0x1f) as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bth_bits() {
        let raw = [
            0x0a, 0x70, 0xff, 0xff, 0xc0, 0x00, 0x01, 0x0a, 0x80, 0xa7, 0x88, 0xbc,
        ];
        let b = Bth::parse(&raw).unwrap();
        assert_eq!(b.opcode, Opcode::RcWriteOnly);
        assert!(!b.se && b.mig);
        assert_eq!((b.pad_cnt, b.tver, b.pkey), (3, 0, 0xffff));
        assert!(b.fecn && b.becn);
        assert_eq!((b.dest_qp, b.psn), (0x10a, 0xa788bc));
        assert!(b.ack_req);
        assert_eq!(b.to_vec().unwrap(), raw);
        let mut bad = b;
        bad.psn = 1 << 24;
        assert!(matches!(bad.to_vec(), Err(CodecError::FieldRange { .. })));
        assert!(Bth::parse(&raw[..11]).is_err());
    }

    #[test]
    fn aeth_syndromes() {
        for b in 0..=0x7fu8 {
            assert_eq!(AethSyndrome::from_byte(b).to_byte(), b);
        }
        assert_eq!(
            AethSyndrome::from_byte(0x1f),
            AethSyndrome::Ack { credits: 31 }
        );
        assert_eq!(
            AethSyndrome::from_byte(0x62),
            AethSyndrome::Nak {
                code: NakCode::RemoteAccessError
            }
        );
        assert_eq!(
            AethSyndrome::from_byte(0x2e),
            AethSyndrome::RnrNak { timer: 14 }
        );
        assert_eq!(credit_count(31), None);
        assert_eq!(credit_count(30), Some(32768));
        assert_eq!(rnr_timer_usec(0), 655_360);
        assert_eq!(rnr_timer_usec(14), 1_280);
    }

    #[test]
    fn ext_roundtrips() {
        let a = AtomicEth {
            va: 0x0102_0304_0506_0708,
            rkey: 0x1122_3344,
            swap_add: 0xdead_beef_0000_0001,
            compare: 0xffff_0000_ffff_0000,
        };
        let v = a.to_vec().unwrap();
        assert_eq!(&v[12..14], &[0xde, 0xad]);
        assert_eq!(AtomicEth::parse(&v).unwrap(), a);
        let d = Deth {
            qkey: Deth::GSI_QKEY,
            src_qp: 1,
        };
        assert_eq!(d.to_vec().unwrap(), [0x80, 1, 0, 0, 0, 0, 0, 1]);
        let f = Feth {
            placement_type: 2,
            selectivity: 1,
        };
        assert_eq!(f.to_vec().unwrap(), [0, 0, 0, 0x12]);
        assert_eq!(Feth::parse(&[0, 0, 0, 0x12]).unwrap(), f);
    }
}
