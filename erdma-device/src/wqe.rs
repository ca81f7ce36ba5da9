//! Send-queue elements (32-byte WQEBBs, up to four per SQE) and receive-queue
//! elements, parsed from the bytes the driver wrote (`erdma_qp.c`
//! `erdma_push_one_sqe`, `erdma_post_recv_one`; rdma-core
//! `providers/erdma/erdma_verbs.c`).

use crate::regs::{field, le};

/// SQE / CQE opcodes (`enum erdma_opcode`).
pub mod op {
    /// RDMA WRITE.
    pub const WRITE: u8 = 0;
    /// RDMA READ.
    pub const READ: u8 = 1;
    /// SEND.
    pub const SEND: u8 = 2;
    /// SEND with immediate.
    pub const SEND_WITH_IMM: u8 = 3;
    /// Receive (CQE).
    pub const RECEIVE: u8 = 4;
    /// Receive of WRITE with immediate (CQE).
    pub const RECV_IMM: u8 = 5;
    /// Receive with invalidate (CQE).
    pub const RECV_INV: u8 = 6;
    /// RDMA WRITE with immediate.
    pub const WRITE_WITH_IMM: u8 = 9;
    /// Receive of SEND with immediate (CQE).
    pub const RSP_SEND_IMM: u8 = 12;
    /// SEND with invalidate.
    pub const SEND_WITH_INV: u8 = 13;
    /// Fast register.
    pub const REG_MR: u8 = 14;
    /// Local invalidate.
    pub const LOCAL_INV: u8 = 15;
    /// RDMA READ with invalidate.
    pub const READ_WITH_INV: u8 = 16;
    /// Atomic compare and swap.
    pub const ATOMIC_CAS: u8 = 17;
    /// Atomic fetch and add.
    pub const ATOMIC_FAA: u8 = 18;
}

/// Most SGEs in one SQE (`ERDMA_MAX_SEND_SGE`).
pub const MAX_SEND_SGE: usize = 6;
/// Most inline bytes (`ERDMA_MAX_INLINE`).
pub const MAX_INLINE: usize = 96;

/// A scatter/gather element (`struct erdma_sge`, little-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Virtual address.
    pub addr: u64,
    /// Length.
    pub length: u32,
    /// Local key (stag).
    pub key: u32,
}

impl Sge {
    fn parse(b: &[u8], off: usize) -> Sge {
        Sge {
            addr: le::u64_at(b, off),
            length: le::u32_at(b, off + 8),
            key: le::u32_at(b, off + 12),
        }
    }
}

/// The decoded SQE header qword.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqeHdr {
    /// SGE count, or inline byte count when `inline`.
    pub sgl_len: u8,
    /// WQEBBs of this SQE.
    pub wqebb_cnt: u8,
    /// QPN.
    pub qpn: u32,
    /// [`op`] code.
    pub opcode: u8,
    /// Direct WQE (not used by Linux or rdma-core today).
    pub dwqe: bool,
    /// Inline data.
    pub inline: bool,
    /// Fence.
    pub fence: bool,
    /// Solicited event.
    pub se: bool,
    /// Completion requested.
    pub ce: bool,
    /// Producer index after this SQE.
    pub wqebb_index: u16,
}

impl SqeHdr {
    /// Decodes the header qword.
    pub fn parse(h: u64) -> SqeHdr {
        SqeHdr {
            sgl_len: field(h, 63, 56) as u8,
            wqebb_cnt: field(h, 54, 52) as u8 + 1,
            qpn: field(h, 51, 32) as u32,
            opcode: field(h, 31, 27) as u8,
            dwqe: h & (1 << 26) != 0,
            inline: h & (1 << 25) != 0,
            fence: h & (1 << 24) != 0,
            se: h & (1 << 23) != 0,
            ce: h & (1 << 22) != 0,
            wqebb_index: field(h, 15, 0) as u16,
        }
    }
}

/// Where a send's payload comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// Gathered from SGEs.
    Sgl(Vec<Sge>),
    /// Carried in the SQE.
    Inline(Vec<u8>),
}

/// A parsed send work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendWqe {
    /// RC SEND / SEND_WITH_IMM / SEND_WITH_INV.
    Send {
        /// Immediate data (wire order, as the driver stored it).
        imm: Option<u32>,
        /// Key to invalidate at the peer.
        invalidate: Option<u32>,
        /// Declared total length.
        length: u32,
        /// Data.
        payload: Payload,
    },
    /// UD SEND / SEND_WITH_IMM (GSI and UD QPs).
    UdSend {
        /// Immediate data.
        imm: Option<u32>,
        /// Declared total length.
        length: u32,
        /// Q_Key.
        qkey: u32,
        /// Destination QPN.
        dst_qpn: u32,
        /// Address handle number.
        ahn: u32,
        /// Data.
        payload: Payload,
    },
    /// RDMA WRITE / WRITE_WITH_IMM.
    Write {
        /// Immediate data.
        imm: Option<u32>,
        /// Declared total length.
        length: u32,
        /// Remote key.
        rkey: u32,
        /// Remote address.
        remote_addr: u64,
        /// Data.
        payload: Payload,
    },
    /// RDMA READ / READ_WITH_INV: remote SGE in the second WQEBB.
    Read {
        /// Local key to invalidate after the read.
        invalidate: Option<u32>,
        /// Length.
        length: u32,
        /// Local sink key.
        sink_key: u32,
        /// Local sink address.
        sink_addr: u64,
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
    },
    /// Atomic CAS / FAA.
    Atomic {
        /// Compare-and-swap (else fetch-and-add).
        cas: bool,
        /// Swap value (CAS) or addend (FAA).
        swap_add: u64,
        /// Compare value (CAS).
        compare: u64,
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: u32,
        /// Local 8-byte result buffer.
        local: Sge,
    },
    /// Fast registration of an FRMR.
    RegMr {
        /// New iova.
        addr: u64,
        /// Length.
        length: u32,
        /// New stag (MPT index and new key byte).
        stag: u32,
        /// `acc::*` bits.
        access: u8,
        /// 0 = page list inline in the SQE, 1 = in the MR's MTT buffer.
        mtt_type: u8,
        /// Pages.
        mtt_cnt: u32,
        /// Inline page list (when `mtt_type == 0`, up to 4).
        inline_mtt: Vec<u64>,
    },
    /// Local invalidate.
    LocalInv {
        /// Stag to invalidate.
        stag: u32,
    },
}

/// Why an SQE was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WqeError {
    /// Unknown or reserved opcode.
    #[error("bad opcode {0}")]
    BadOpcode(u8),
    /// Too many SGEs or inline bytes, or WQEBB count too small / too large.
    #[error("bad SGL ({0})")]
    BadSgl(&'static str),
    /// Opcode not allowed on this QP type.
    #[error("opcode not allowed on this QP type")]
    WrongQpType,
}

/// Parses an SQE from its WQEBBs (`b.len() == 32 * hdr.wqebb_cnt`).
pub fn parse_sqe(hdr: &SqeHdr, b: &[u8], ud: bool) -> Result<SendWqe, WqeError> {
    let avail = b.len();
    let sgl = |off: usize| -> Result<Payload, WqeError> {
        let n = usize::from(hdr.sgl_len);
        if hdr.inline {
            if n > MAX_INLINE || off + n > avail {
                return Err(WqeError::BadSgl("inline"));
            }
            Ok(Payload::Inline(b[off..off + n].to_vec()))
        } else {
            if n > MAX_SEND_SGE || off + 16 * n > avail {
                return Err(WqeError::BadSgl("sge count"));
            }
            Ok(Payload::Sgl(
                (0..n).map(|i| Sge::parse(b, off + 16 * i)).collect(),
            ))
        }
    };
    let need = |bytes: usize| -> Result<(), WqeError> {
        if avail < bytes {
            Err(WqeError::BadSgl("SQE too short"))
        } else {
            Ok(())
        }
    };
    let w = match hdr.opcode {
        op::SEND | op::SEND_WITH_IMM | op::SEND_WITH_INV if ud => {
            if hdr.opcode == op::SEND_WITH_INV {
                return Err(WqeError::WrongQpType);
            }
            SendWqe::UdSend {
                imm: (hdr.opcode == op::SEND_WITH_IMM).then(|| le::be32_at(b, 8)),
                length: le::u32_at(b, 12),
                qkey: le::u32_at(b, 16),
                dst_qpn: le::u32_at(b, 20),
                ahn: le::u32_at(b, 24),
                payload: sgl(32)?,
            }
        }
        _ if ud => return Err(WqeError::WrongQpType),
        op::SEND | op::SEND_WITH_IMM | op::SEND_WITH_INV => SendWqe::Send {
            imm: (hdr.opcode == op::SEND_WITH_IMM).then(|| le::be32_at(b, 8)),
            invalidate: (hdr.opcode == op::SEND_WITH_INV).then(|| le::u32_at(b, 8)),
            length: le::u32_at(b, 12),
            payload: sgl(16)?,
        },
        op::WRITE | op::WRITE_WITH_IMM => SendWqe::Write {
            imm: (hdr.opcode == op::WRITE_WITH_IMM).then(|| le::be32_at(b, 8)),
            length: le::u32_at(b, 12),
            rkey: le::u32_at(b, 16),
            remote_addr: u64::from(le::u32_at(b, 20)) | (u64::from(le::u32_at(b, 24)) << 32),
            payload: sgl(32)?,
        },
        op::READ | op::READ_WITH_INV => {
            need(48)?;
            let remote = Sge::parse(b, 32);
            SendWqe::Read {
                invalidate: (hdr.opcode == op::READ_WITH_INV).then(|| le::u32_at(b, 8)),
                length: le::u32_at(b, 12),
                sink_key: le::u32_at(b, 16),
                sink_addr: u64::from(le::u32_at(b, 20)) | (u64::from(le::u32_at(b, 24)) << 32),
                remote_addr: remote.addr,
                rkey: remote.key,
            }
        }
        op::ATOMIC_CAS | op::ATOMIC_FAA => {
            need(64)?;
            let remote = Sge::parse(b, 32);
            SendWqe::Atomic {
                cas: hdr.opcode == op::ATOMIC_CAS,
                swap_add: le::u64_at(b, 16),
                compare: le::u64_at(b, 24),
                remote_addr: remote.addr,
                rkey: remote.key,
                local: Sge::parse(b, 48),
            }
        }
        op::REG_MR => {
            let attrs = le::u32_at(b, 24);
            let mtt_type = ((attrs >> 6) & 3) as u8;
            let mtt_cnt = attrs >> 12;
            let mut inline_mtt = Vec::new();
            if mtt_type == 0 {
                if mtt_cnt > 4 {
                    return Err(WqeError::BadSgl("inline MTT > 4"));
                }
                need(32 + 8 * mtt_cnt as usize)?;
                inline_mtt = (0..mtt_cnt as usize)
                    .map(|i| le::u64_at(b, 32 + 8 * i))
                    .collect();
            }
            SendWqe::RegMr {
                addr: le::u64_at(b, 8),
                length: le::u32_at(b, 16),
                stag: le::u32_at(b, 20),
                access: ((attrs >> 1) & 0x1f) as u8,
                mtt_type,
                mtt_cnt,
                inline_mtt,
            }
        }
        op::LOCAL_INV => SendWqe::LocalInv {
            stag: le::u32_at(b, 20),
        },
        other => return Err(WqeError::BadOpcode(other)),
    };
    Ok(w)
}

/// A receive-queue element (`struct erdma_rqe`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rqe {
    /// Producer index after this RQE (`rq_pi + 1`).
    pub qe_idx: u16,
    /// QPN.
    pub qpn: u32,
    /// Buffer address.
    pub to: u64,
    /// Buffer length (0 = no SGE).
    pub length: u32,
    /// Buffer key.
    pub stag: u32,
}

impl Rqe {
    /// Parses 32 bytes.
    pub fn parse(b: &[u8]) -> Rqe {
        Rqe {
            qe_idx: le::u16_at(b, 0),
            qpn: le::u32_at(b, 4),
            to: le::u64_at(b, 16),
            length: le::u32_at(b, 24),
            stag: le::u32_at(b, 28),
        }
    }
}
