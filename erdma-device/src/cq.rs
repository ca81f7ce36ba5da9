//! Completion queues and the 32-byte big-endian CQE (`struct erdma_cqe`).

use pci_model::Dma;

use crate::mr::{PagedBuf, XlateError};
use crate::regs::CQE_SIZE;

/// CQE queue types (`ERDMA_CQE_QTYPE_*`).
pub mod qtype {
    /// Send queue.
    pub const SQ: u8 = 0;
    /// Receive queue.
    pub const RQ: u8 = 1;
    /// Command queue.
    pub const CMDQ: u8 = 2;
}

/// CQE status codes (`enum erdma_wc_status`).
pub mod wc_status {
    /// Success.
    pub const SUCCESS: u8 = 0;
    /// General error.
    pub const GENERAL_ERR: u8 = 1;
    /// Receive WQE format error.
    pub const RECV_WQE_FORMAT_ERR: u8 = 2;
    /// Receive stag invalid.
    pub const RECV_STAG_INVALID_ERR: u8 = 3;
    /// Receive address violation.
    pub const RECV_ADDR_VIOLATION_ERR: u8 = 4;
    /// Receive right violation.
    pub const RECV_RIGHT_VIOLATION_ERR: u8 = 5;
    /// Receive PD error.
    pub const RECV_PDID_ERR: u8 = 6;
    /// Send WQE format error.
    pub const SEND_WQE_FORMAT_ERR: u8 = 8;
    /// Send WQE ORD exceeded.
    pub const SEND_WQE_ORD_EXCEED: u8 = 9;
    /// Send stag invalid.
    pub const SEND_STAG_INVALID_ERR: u8 = 10;
    /// Send address violation.
    pub const SEND_ADDR_VIOLATION_ERR: u8 = 11;
    /// Send right violation.
    pub const SEND_RIGHT_VIOLATION_ERR: u8 = 12;
    /// Send PD error.
    pub const SEND_PDID_ERR: u8 = 13;
    /// Flushed.
    pub const FLUSH_ERR: u8 = 15;
    /// Retries exhausted.
    pub const RETRY_EXC_ERR: u8 = 16;
}

/// One work completion, before encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    /// `erdma_opcode` of the completed work.
    pub opcode: u8,
    /// [`qtype`].
    pub qtype: u8,
    /// [`wc_status`].
    pub syndrome: u8,
    /// SQ: index of the SQE's first WQEBB; RQ: index of the RQE.
    pub qe_idx: u32,
    /// Local QPN.
    pub qpn: u32,
    /// Immediate data as the driver reads it (`le32`, the wire value).
    pub imm: u32,
    /// Invalidated rkey (RECV_INV), written big-endian in the same dword.
    pub inv_rkey: Option<u32>,
    /// Byte count.
    pub size: u32,
    /// UD info dword (ntype bit 31, SL 27:20, source QPN 19:0).
    pub ud_info: u32,
}

impl Cqe {
    /// Encodes with the owner bit.
    pub fn encode(&self, owner: bool) -> [u8; 32] {
        let mut b = [0u8; 32];
        let hdr = (u32::from(owner) << 31)
            | (u32::from(self.opcode) << 16)
            | (u32::from(self.qtype) << 8)
            | u32::from(self.syndrome);
        b[0..4].copy_from_slice(&hdr.to_be_bytes());
        b[4..8].copy_from_slice(&self.qe_idx.to_be_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        match self.inv_rkey {
            Some(k) => b[12..16].copy_from_slice(&k.to_be_bytes()),
            None => b[12..16].copy_from_slice(&self.imm.to_le_bytes()),
        }
        b[16..20].copy_from_slice(&self.size.to_be_bytes());
        b[28..32].copy_from_slice(&self.ud_info.to_be_bytes());
        b
    }
}

/// Result of posting a CQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CqPush {
    /// The CQ was armed and this CQE fires an event (CEQE to `eqn`).
    pub notify: bool,
    /// The CQ looked full (stale CI): written anyway.
    pub overrun: bool,
}

/// One completion queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletionQueue {
    /// CQN.
    pub cqn: u32,
    /// Ring.
    pub buf: PagedBuf,
    /// Entries (power of two).
    pub depth: u32,
    /// CEQ number events go to.
    pub eqn: u32,
    /// Doorbell record address.
    pub dbrec: u64,
    /// Producer index.
    pub pi: u32,
    /// Consumer index from the last doorbell (24 bits).
    pub ci: u32,
    /// Armed for the next completion.
    pub armed: bool,
    /// Armed for solicited completions only.
    pub solicited_only: bool,
}

impl CompletionQueue {
    /// A new, unarmed CQ.
    pub fn new(cqn: u32, buf: PagedBuf, depth: u32, eqn: u32, dbrec: u64) -> Self {
        CompletionQueue {
            cqn,
            buf,
            depth,
            eqn,
            dbrec,
            pi: 0,
            ci: 0,
            armed: false,
            solicited_only: false,
        }
    }

    /// Writes `cqe` at the producer index.
    pub fn push(
        &mut self,
        dma: &dyn Dma,
        cqe: &Cqe,
        solicited: bool,
    ) -> Result<CqPush, XlateError> {
        let overrun = (self.pi.wrapping_sub(self.ci) & 0xff_ffff) >= self.depth;
        let owner = self.pi & self.depth == 0;
        let off = u64::from(self.pi & (self.depth - 1)) * CQE_SIZE;
        let bytes = cqe.encode(owner);
        let addr = self.buf.addr(dma, off)?;
        dma.write(addr.wrapping_add(4), &bytes[4..])?;
        dma.write(addr, &bytes[..4])?;
        self.pi = self.pi.wrapping_add(1);
        let fire = self.armed && (!self.solicited_only || solicited || cqe.syndrome != 0);
        if fire {
            self.armed = false;
        }
        Ok(CqPush {
            notify: fire,
            overrun,
        })
    }

    /// The CQ doorbell: CI update and optional arm. Returns true when an
    /// event must fire at once (armed with completions already past the CI).
    pub fn doorbell(&mut self, ci: u32, arm: bool, sol: bool) -> bool {
        self.ci = ci & 0xff_ffff;
        if arm {
            if (self.pi & 0xff_ffff) != self.ci {
                self.armed = false;
                return true;
            }
            self.armed = true;
            self.solicited_only = sol;
        }
        false
    }
}
