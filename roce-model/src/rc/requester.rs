//! Requester (rxe `rxe_req.c`): segments send WQEs into request packets,
//! assigns PSNs, enforces the send window and rd_atomic credits, and rewinds
//! for go-back-N retransmission.

use std::time::Instant;

use super::{
    emit, sg_read, QpState, QueuePair, SendOp, WcStatus, MAX_PKT_PER_ACK, MAX_UNACKED_PSNS,
};
use crate::headers::{AtomicEth, Bth, Reth};
use crate::mr::{MemError, MemoryStore};
use crate::opcode::Opcode;
use crate::packet::ExtHeaders;
use crate::psn::Psn;

impl QueuePair {
    /// Rewind the requester to the oldest unacknowledged PSN (`comp.psn`),
    /// re-sending from the head WQE (rxe `req_retry`).
    pub(super) fn rewind(&mut self) {
        let pmtu = self.pmtu();
        self.req.wqe_idx = 0;
        self.req.offset = 0;
        self.req.noack_pkts = 0;
        self.req.psn = self.comp.psn;
        let Some(w) = self.sq.front() else {
            return;
        };
        if !w.assigned {
            return;
        }
        let (offset, psn) = match w.wr.op {
            SendOp::AtomicCmpAndSwp { .. } | SendOp::AtomicFetchAndAdd { .. } => (0, w.first_psn),
            SendOp::RdmaRead { .. } => (w.read_done, w.first_psn.add(w.read_done / pmtu)),
            _ => {
                let k = self.comp.psn.diff(w.first_psn).max(0) as u64;
                let off = (k * u64::from(pmtu)).min(u64::from(w.len)) as u32;
                (off, w.first_psn.add(off / pmtu))
            }
        };
        self.req.offset = offset;
        self.req.psn = psn;
    }

    /// Build the next request packet, if the window, credits and timers allow.
    pub(super) fn next_request(
        &mut self,
        now: Instant,
        mem: &dyn MemoryStore,
        out: &mut Vec<u8>,
        headroom: usize,
    ) -> bool {
        if self.state != QpState::Rts || self.req.rnr_until.is_some() {
            return false;
        }
        if self.req.need_retry {
            self.req.need_retry = false;
            self.stats.retries += 1;
            self.rewind();
        }
        let pmtu = self.pmtu();
        let idx = self.req.wqe_idx;
        let Some(op) = self.sq.get(idx).map(|w| w.wr.op) else {
            return false;
        };
        if self.req.psn.diff(self.comp.psn) >= MAX_UNACKED_PSNS {
            return false;
        }
        if op.is_read_or_atomic() {
            let inflight = self
                .sq
                .iter()
                .take(idx)
                .filter(|w| w.wr.op.is_read_or_atomic())
                .count();
            if inflight >= usize::from(self.attr.max_rd_atomic) {
                return false;
            }
        }
        let psn = self.req.psn;
        let offset = self.req.offset;
        let wqe = &mut self.sq[idx];
        if !wqe.assigned {
            let n = wqe.npkts(pmtu);
            wqe.first_psn = psn;
            wqe.last_psn = psn.add(n - 1);
            wqe.assigned = true;
        }
        debug_assert_eq!(
            psn,
            wqe.first_psn.add(offset / pmtu),
            "requester PSN out of step with its WQE"
        );
        let len = wqe.len;
        let dest = self.attr.dest_qpn;
        let remaining = len - offset;
        let last = remaining <= pmtu;
        let first = offset == 0;
        let mut ext = ExtHeaders::default();
        let (opcode, payload_len, psns) = match op {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => {
                let opc = match (first, last, op) {
                    (true, true, SendOp::Send) => Opcode::RcSendOnly,
                    (true, true, SendOp::SendWithImm { .. }) => Opcode::RcSendOnlyImm,
                    (true, true, _) => Opcode::RcSendOnlyInv,
                    (true, false, _) => Opcode::RcSendFirst,
                    (false, false, _) => Opcode::RcSendMiddle,
                    (false, true, SendOp::Send) => Opcode::RcSendLast,
                    (false, true, SendOp::SendWithImm { .. }) => Opcode::RcSendLastImm,
                    (false, true, _) => Opcode::RcSendLastInv,
                };
                if last {
                    match op {
                        SendOp::SendWithImm { imm } => ext.imm_dt = Some(crate::ImmDt { imm }),
                        SendOp::SendWithInv { rkey } => ext.ieth = Some(crate::Ieth { rkey }),
                        _ => {}
                    }
                }
                (opc, remaining.min(pmtu), 1)
            }
            SendOp::RdmaWrite { remote_addr, rkey }
            | SendOp::RdmaWriteWithImm {
                remote_addr, rkey, ..
            } => {
                let imm = match op {
                    SendOp::RdmaWriteWithImm { imm, .. } => Some(imm),
                    _ => None,
                };
                let opc = match (first, last, imm.is_some()) {
                    (true, true, false) => Opcode::RcWriteOnly,
                    (true, true, true) => Opcode::RcWriteOnlyImm,
                    (true, false, _) => Opcode::RcWriteFirst,
                    (false, false, _) => Opcode::RcWriteMiddle,
                    (false, true, false) => Opcode::RcWriteLast,
                    (false, true, true) => Opcode::RcWriteLastImm,
                };
                if first {
                    ext.reth = Some(Reth {
                        va: remote_addr,
                        rkey,
                        len,
                    });
                }
                if last {
                    ext.imm_dt = imm.map(|imm| crate::ImmDt { imm });
                }
                (opc, remaining.min(pmtu), 1)
            }
            SendOp::RdmaRead { remote_addr, rkey } => {
                ext.reth = Some(Reth {
                    va: remote_addr.wrapping_add(u64::from(offset)),
                    rkey,
                    len: remaining,
                });
                wqe.read_restart = true;
                (
                    Opcode::RcReadRequest,
                    0,
                    Psn::packets_for(u64::from(remaining), pmtu),
                )
            }
            SendOp::AtomicCmpAndSwp {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                ext.atomic_eth = Some(AtomicEth {
                    va: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                });
                (Opcode::RcCompareSwap, 0, 1)
            }
            SendOp::AtomicFetchAndAdd {
                remote_addr,
                rkey,
                add,
            } => {
                ext.atomic_eth = Some(AtomicEth {
                    va: remote_addr,
                    rkey,
                    swap_add: add,
                    compare: 0,
                });
                (Opcode::RcFetchAdd, 0, 1)
            }
        };
        let ends = opcode.info().ends_message();
        let ack_req = if ends || self.req.noack_pkts > MAX_PKT_PER_ACK {
            self.req.noack_pkts = 0;
            true
        } else {
            self.req.noack_pkts += 1;
            false
        };
        let mut bth = Bth::new(opcode, dest, psn.value());
        bth.ack_req = ack_req;
        bth.se = ends
            && wqe.wr.solicited
            && matches!(
                op,
                SendOp::Send
                    | SendOp::SendWithImm { .. }
                    | SendOp::SendWithInv { .. }
                    | SendOp::RdmaWriteWithImm { .. }
            );
        let pd = self.pd;
        let built = emit(bth, &ext, payload_len as usize, out, headroom, |dst| {
            if dst.is_empty() {
                Ok(())
            } else if !wqe.wr.inline_data.is_empty() {
                let at = offset as usize;
                let src = wqe
                    .wr
                    .inline_data
                    .get(at..at + dst.len())
                    .ok_or(MemError::Backing("inline data"))?;
                dst.copy_from_slice(src);
                Ok(())
            } else {
                sg_read(mem, pd, &wqe.wr.sg_list, u64::from(offset), dst)
            }
        });
        if built.is_err() {
            // Local protection error: this WQE fails, the QP goes to ERROR.
            self.sq[idx].status = Some(WcStatus::LocProtErr);
            self.enter_error();
            return false;
        }
        // Advance.
        self.req.psn = psn.add(psns);
        if ends {
            self.sq[idx].sent = true;
            self.req.wqe_idx += 1;
            self.req.offset = 0;
        } else {
            self.req.offset += payload_len;
        }
        if self.req.retrans_at.is_none() {
            self.req.retrans_at = self.attr.ack_timeout().map(|d| now + d);
        }
        true
    }
}
