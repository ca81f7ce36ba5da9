//! The data path: SQ / RQ consumption, UD (GSI) sends and receives done by
//! the device itself, RC work run by `roce_model`'s engines, CQEs, frames.
//!
//! RC payload never passes through the daemon's memory: the engines resolve
//! the driver's keys through [`GuestStore`] (MR table + MTT translation over
//! `Dma`) at the moment they move bytes, so a send is gathered from guest
//! memory straight into its frame (`poll_transmit_into` writes after the
//! room left for the outer headers), and a received WRITE, READ response,
//! SEND or atomic lands straight in the guest buffer. Incoming READs are
//! answered from guest memory as each response packet is built.

use std::time::Instant;

use pci_model::{DeviceIo, RxRefusal, TraceKind};
use roce_model::{
    Deth, FrameBuilder, NetLayer, NetParams, Opcode, PacketBuilder, RecvWr, RoceFrame, SendOp,
    SendWr, Sge, Transport, WcOpcode, WcStatus,
};

use crate::cq::{qtype, wc_status, Cqe};
use crate::device::{ErdmaDevice, RxRefusalNote};
use crate::mr::{acc, mr_type, Mtt, XlateError};
use crate::qp::{ipv4_of_gid, qps, Av, Inflight, RecvSlot};
use crate::regs::{le, SQEBB_SIZE};
use crate::store::GuestStore;
use crate::wqe::{op, parse_sqe, Payload, Rqe, SendWqe, SqeHdr};

fn xlate_status(e: &XlateError, send: bool) -> u8 {
    match (e, send) {
        (XlateError::InvalidKey(_) | XlateError::NotValid(_), true) => {
            wc_status::SEND_STAG_INVALID_ERR
        }
        (XlateError::InvalidKey(_) | XlateError::NotValid(_), false) => {
            wc_status::RECV_STAG_INVALID_ERR
        }
        (XlateError::PdMismatch, true) => wc_status::SEND_PDID_ERR,
        (XlateError::PdMismatch, false) => wc_status::RECV_PDID_ERR,
        (XlateError::Access, true) => wc_status::SEND_RIGHT_VIOLATION_ERR,
        (XlateError::Access, false) => wc_status::RECV_RIGHT_VIOLATION_ERR,
        (_, true) => wc_status::SEND_ADDR_VIOLATION_ERR,
        (_, false) => wc_status::RECV_ADDR_VIOLATION_ERR,
    }
}

/// The CQE status of an engine completion (`send`: on the SQ).
fn engine_status(s: WcStatus, send: bool) -> u8 {
    match (s, send) {
        (WcStatus::Success, _) => wc_status::SUCCESS,
        (WcStatus::WrFlushErr, _) => wc_status::FLUSH_ERR,
        (WcStatus::RetryExcErr | WcStatus::RnrRetryExcErr, _) => wc_status::RETRY_EXC_ERR,
        // A local buffer the engine could not read or write: the driver's
        // key was checked when the WQE was taken, so what failed is the
        // range (its pages, or an MR changed since).
        (WcStatus::LocProtErr, true) => wc_status::SEND_ADDR_VIOLATION_ERR,
        (WcStatus::LocProtErr | WcStatus::LocLenErr, false) => wc_status::RECV_ADDR_VIOLATION_ERR,
        (WcStatus::LocLenErr, true) => wc_status::SEND_WQE_FORMAT_ERR,
        (WcStatus::RemAccessErr, _) => wc_status::RECV_RIGHT_VIOLATION_ERR,
        _ => wc_status::GENERAL_ERR,
    }
}

impl ErdmaDevice {
    /// When the engines' timers want a `poll`, or now if work is left over.
    pub(crate) fn engine_timeout(&self, now: Instant) -> Option<Instant> {
        // Work that makes frames waits while the edge is paused: it polls
        // again when the pause ends.
        let tx_work = !self.sq_kicks.is_empty() || self.tx_more;
        if self.cmdq_kick
            || !self.rq_kicks.is_empty()
            || !self.loopback.is_empty()
            || (tx_work && !self.tx_paused)
        {
            return Some(now);
        }
        self.qps
            .values()
            .filter_map(|q| q.engine.as_ref()?.poll_timeout())
            .min()
    }

    /// Reads guest memory named by a local SGE (stag or the local DMA key).
    fn read_local(
        &self,
        dma: &dyn pci_model::Dma,
        pd: u32,
        key: u32,
        addr: u64,
        out: &mut [u8],
    ) -> Result<(), XlateError> {
        if key == self.cfg.local_dma_key {
            return Ok(dma.read(addr, out)?);
        }
        let mr = self.mrs.lookup(key, Some(pd), 0)?;
        mr.read(dma, addr, out)
    }

    /// Writes guest memory named by a local SGE needing local write.
    fn write_local(
        &self,
        dma: &dyn pci_model::Dma,
        pd: u32,
        key: u32,
        addr: u64,
        data: &[u8],
    ) -> Result<(), XlateError> {
        if key == self.cfg.local_dma_key {
            return Ok(dma.write(addr, data)?);
        }
        let mr = self.mrs.lookup(key, Some(pd), acc::LW)?;
        mr.write(dma, addr, data)
    }

    /// Gathers a UD payload (at most `max` bytes) from guest memory.
    fn gather(
        &mut self,
        io: &DeviceIo<'_>,
        pd: u32,
        p: &Payload,
        max: usize,
    ) -> Result<Vec<u8>, u8> {
        match p {
            Payload::Inline(b) if b.len() <= max => Ok(b.clone()),
            Payload::Inline(_) => Err(wc_status::SEND_WQE_FORMAT_ERR),
            Payload::Sgl(sges) => {
                let total: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
                if total > max as u64 {
                    return Err(wc_status::SEND_WQE_FORMAT_ERR);
                }
                let mut out = vec![0u8; total as usize];
                let mut at = 0usize;
                for s in sges {
                    let n = s.length as usize;
                    if let Err(e) = self.read_local(io.dma, pd, s.key, s.addr, &mut out[at..at + n])
                    {
                        if matches!(e, XlateError::Dma(_)) {
                            self.counters.dma_errors += 1;
                        }
                        return Err(xlate_status(&e, true));
                    }
                    at += n;
                }
                Ok(out)
            }
        }
    }

    /// Checks a local SGE the way the engine will use it (key, PD, rights,
    /// bounds), so that a bad key fails at once with the status the driver
    /// expects rather than as a protection error in the engine.
    fn check_local_sge(&self, pd: u32, key: u32, addr: u64, len: u32, need: u8) -> Result<(), u8> {
        if key == self.cfg.local_dma_key {
            return match addr.checked_add(u64::from(len)) {
                Some(_) => Ok(()),
                None => Err(wc_status::SEND_ADDR_VIOLATION_ERR),
            };
        }
        self.mrs
            .lookup(key, Some(pd), need)
            .and_then(|mr| mr.check(addr, u64::from(len)))
            .map_err(|e| xlate_status(&e, true))
    }

    /// Writes a CQE on `cqn` and fires its event if armed.
    pub(crate) fn post_cqe(&mut self, io: &mut DeviceIo<'_>, cqn: u32, cqe: &Cqe, se: bool) {
        let mut faulted = *cqe;
        let injected = self.cqe_fault(&mut faulted, io);
        let cqe = &faulted;
        io.trace(TraceKind::Completion, || {
            format!(
                "cqn={cqn} qpn={} {} {} idx={} len={} status={}",
                cqe.qpn,
                if cqe.qtype == qtype::SQ { "SQ" } else { "RQ" },
                crate::names::opcode(cqe.opcode),
                cqe.qe_idx,
                cqe.size,
                crate::names::wc_status(cqe.syndrome)
            )
        });
        if injected && self.qps.get(&cqe.qpn).is_some_and(|q| !q.is_ud()) {
            // As after a real error completion on an RC QP: its other work
            // completes flushed. (A UD QP keeps its state: one datagram
            // failed.)
            self.enter_error(cqe.qpn);
        }
        let Some(cq) = self.cqs.get_mut(&cqn) else {
            self.counters.cqes_dropped += 1;
            return;
        };
        if cqe.syndrome != wc_status::SUCCESS && cqe.syndrome != wc_status::FLUSH_ERR {
            self.counters.error_cqes += 1;
            if self.last_error_completion.is_none() {
                self.last_error_completion = Some(format!(
                    "QP {}: CQE opcode {} status {}",
                    cqe.qpn, cqe.opcode, cqe.syndrome
                ));
            }
        }
        match cq.push(io.dma, cqe, se) {
            Ok(p) => {
                self.counters.cqes_written += 1;
                if p.overrun {
                    self.counters.cq_overruns += 1;
                }
                if p.notify {
                    self.cq_event(io, cqn);
                }
            }
            Err(_) => {
                self.counters.cqes_dropped += 1;
                self.counters.dma_errors += 1;
                let ev = crate::eq::aeqe(crate::eq::ae_type::CQ_ERR, 0, cqn, 0);
                self.async_event(io, ev);
            }
        }
    }

    /// One pass over the data path.
    pub(crate) fn run_datapath(&mut self, io: &mut DeviceIo<'_>) {
        self.tx_more = false;
        let rc: Vec<u32> = self
            .qps
            .iter()
            .filter(|(_, q)| q.engine.is_some())
            .map(|(n, _)| *n)
            .collect();
        for qpn in &rc {
            self.pump_engine(*qpn, io);
        }
        let sq: Vec<u32> = std::mem::take(&mut self.sq_kicks).into_iter().collect();
        for qpn in sq {
            if !self.process_sq(qpn, io) {
                self.sq_kicks.insert(qpn);
            }
        }
        let rq: Vec<u32> = std::mem::take(&mut self.rq_kicks).into_iter().collect();
        for qpn in rq {
            if !self.process_rq(qpn, io) {
                self.rq_kicks.insert(qpn);
            }
        }
        for qpn in &rc {
            self.pump_engine(*qpn, io);
        }
    }

    /// Reads the SQE at the consumer index: (header, bytes).
    fn read_sqe(&mut self, qpn: u32, io: &DeviceIo<'_>) -> Result<(SqeHdr, Vec<u8>), ()> {
        let Some(qp) = self.qps.get(&qpn) else {
            return Err(());
        };
        let mask = qp.sq_depth - 1;
        let at = |i: u16| u64::from(u32::from(i) & mask) * SQEBB_SIZE;
        let mut first = [0u8; 32];
        if qp.sq.read(io.dma, at(qp.sq_ci), &mut first).is_err() {
            self.counters.dma_errors += 1;
            return Err(());
        }
        let hdr = SqeHdr::parse(le::u64_at(&first, 0));
        let cnt = u16::from(hdr.wqebb_cnt).min(4);
        let mut buf = first.to_vec();
        for i in 1..cnt {
            let mut bb = [0u8; 32];
            if qp
                .sq
                .read(io.dma, at(qp.sq_ci.wrapping_add(i)), &mut bb)
                .is_err()
            {
                self.counters.dma_errors += 1;
                return Err(());
            }
            buf.extend_from_slice(&bb);
        }
        Ok((hdr, buf))
    }

    /// Entries posted on `qpn`'s SQ (or, with `rq`, its RQ) and not yet
    /// taken. `None` when the QP is gone, the ring is empty, or its
    /// producer index is beyond the ring: a bad doorbell (stale or
    /// hostile), counted and refused by emptying the ring, or the device
    /// would replay old ring contents (and, with a PI it can never land
    /// on, never stop).
    fn ring_posted(&mut self, qpn: u32, rq: bool) -> Option<u16> {
        let qp = self.qps.get_mut(&qpn)?;
        match qp.posted(rq) {
            Some(0) => None,
            Some(n) => Some(n),
            None => {
                self.counters.bad_doorbells += 1;
                if rq {
                    qp.rq_pi = qp.rq_ci;
                } else {
                    qp.sq_pi = qp.sq_ci;
                }
                None
            }
        }
    }

    /// Consumes SQEs of `qpn`; false when the budget ran out.
    fn process_sq(&mut self, qpn: u32, io: &mut DeviceIo<'_>) -> bool {
        for _ in 0..self.cfg.poll_budget {
            let Some(outstanding) = self.ring_posted(qpn, false) else {
                return true;
            };
            if self.qp_stalled(qpn) {
                // Work held: the rule counts it once; the SQ is kicked
                // again when the rule is cleared.
                self.qp_stall_hit(qpn, io);
                return true;
            }
            let Some(qp) = self.qps.get(&qpn) else {
                return true;
            };
            let state = qp.state;
            let stopped = qp.sq_stopped;
            let idx = qp.sq_ci;
            let (scqn, pd, ud) = (qp.scqn, qp.pd, qp.is_ud());
            if state != qps::ERROR && (state != qps::RTS || stopped) {
                return true;
            }
            let Ok((hdr, bytes)) = self.read_sqe(qpn, io) else {
                // Unreadable ring: the QP cannot go on.
                self.qp_fatal(qpn, io);
                return true;
            };
            let cnt = u16::from(hdr.wqebb_cnt);
            if state == qps::ERROR {
                self.advance_sq(qpn, cnt.clamp(1, 4));
                self.flush_wqe(io, scqn, qpn, qtype::SQ, hdr.opcode, idx);
                continue;
            }
            if cnt > outstanding {
                // The SQE claims more WQEBBs than the doorbell posted: the
                // rest would be stale ring contents. Refuse the doorbell,
                // as the command queue does.
                self.counters.bad_doorbells += 1;
                if let Some(qp) = self.qps.get_mut(&qpn) {
                    qp.sq_pi = qp.sq_ci;
                }
                return true;
            }
            if cnt == 0 || u64::from(cnt) > crate::regs::MAX_WQEBB_PER_SQE || hdr.qpn != qpn {
                self.counters.bad_wqes += 1;
                self.advance_sq(qpn, cnt.clamp(1, 4));
                self.sq_error(qpn, idx, hdr.opcode, wc_status::SEND_WQE_FORMAT_ERR, io);
                continue;
            }
            if self.tx_budget_spent(io) {
                // This poll has made all the frames it may: the rest of the
                // SQ is taken on the next one.
                return false;
            }
            let rc = !ud && hdr.opcode != op::REG_MR && hdr.opcode != op::LOCAL_INV;
            if rc && !self.engine_has_room(qpn, true) {
                return true;
            }
            // Completions of one SQ stay in order: a local operation (fast
            // register, local invalidate) or a fenced WQE waits until the
            // work already inside the RC engine has completed.
            let local = matches!(hdr.opcode, op::REG_MR | op::LOCAL_INV) || hdr.fence;
            if local {
                if let Some(qp) = self.qps.get_mut(&qpn) {
                    if qp.engine.is_some() && !qp.inflight.is_empty() {
                        qp.sq_wait_drain = true;
                        return true;
                    }
                }
            }
            self.advance_sq(qpn, cnt);
            self.counters.wqes_executed += 1;
            let wqe = match parse_sqe(&hdr, &bytes, ud) {
                Ok(w) => w,
                Err(_) => {
                    self.counters.bad_wqes += 1;
                    self.sq_error(qpn, idx, hdr.opcode, wc_status::SEND_WQE_FORMAT_ERR, io);
                    continue;
                }
            };
            let res = self.execute_wqe(qpn, pd, &hdr, idx, wqe, io);
            match res {
                Ok(Some(size)) => {
                    if hdr.ce {
                        let cqe = Cqe {
                            opcode: hdr.opcode,
                            qtype: qtype::SQ,
                            syndrome: wc_status::SUCCESS,
                            qe_idx: u32::from(idx),
                            qpn,
                            size,
                            ..Cqe::default()
                        };
                        self.post_cqe(io, scqn, &cqe, false);
                    }
                }
                Ok(None) => {}
                Err(st) => self.sq_error(qpn, idx, hdr.opcode, st, io),
            }
        }
        false
    }

    /// May the QP hand one more work request to its engine (`send`: SQ)?
    /// If not, the queue waits, without polling, until a completion frees
    /// room: the device's memory for RC work stays within its budget
    /// whatever the driver posts.
    fn engine_has_room(&mut self, qpn: u32, send: bool) -> bool {
        let Some(qp) = self.qps.get(&qpn) else {
            return false;
        };
        let held = if send {
            qp.inflight.len()
        } else {
            qp.recvs.len()
        };
        if held < self.cfg.max_wrs_per_qp && self.engine_wrs < self.cfg.max_engine_wrs {
            return true;
        }
        self.counters.engine_wr_stalls += 1;
        if send {
            self.stalled_sq.insert(qpn);
        } else {
            self.stalled_rq.insert(qpn);
        }
        false
    }

    /// A work request left an engine: queues that waited for room go on.
    fn engine_wr_done(&mut self) {
        self.engine_wrs = self.engine_wrs.saturating_sub(1);
        self.sq_kicks.append(&mut self.stalled_sq);
        self.rq_kicks.append(&mut self.stalled_rq);
    }

    fn advance_sq(&mut self, qpn: u32, n: u16) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            qp.sq_ci = qp.sq_ci.wrapping_add(n);
        }
    }

    /// An error completion on the SQ; the QP moves to ERROR (the rest is
    /// flushed).
    fn sq_error(&mut self, qpn: u32, idx: u16, opcode: u8, st: u8, io: &mut DeviceIo<'_>) {
        let Some(scqn) = self.qps.get(&qpn).map(|q| q.scqn) else {
            return;
        };
        // Earlier WQEs inside the engine go first, as hardware executes in
        // order: what they may send now is sent (reading guest memory as it
        // goes, so one of them may meet its own error and take the QP to
        // ERROR; this WQE is then only flushed). The rest of them complete
        // flushed before this one, so that the SQ's CQEs stay in order (the
        // drivers derive their SQ consumer index from each CQE and rdma-core
        // drops one that goes backwards).
        self.pump_engine(qpn, io);
        let earlier_failed = self.qps.get(&qpn).is_some_and(|q| q.state == qps::ERROR);
        self.enter_error(qpn);
        self.pump_engine(qpn, io);
        let cqe = Cqe {
            opcode,
            qtype: qtype::SQ,
            syndrome: if earlier_failed {
                wc_status::FLUSH_ERR
            } else {
                st
            },
            qe_idx: u32::from(idx),
            qpn,
            ..Cqe::default()
        };
        self.post_cqe(io, scqn, &cqe, false);
    }

    pub(crate) fn enter_error(&mut self, qpn: u32) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            qp.state = qps::ERROR;
            if let Some(e) = qp.engine.as_mut() {
                let _ = e.modify(roce_model::QpState::Error, &roce_model::QpAttr::default());
            }
        }
        self.sq_kicks.insert(qpn);
        self.rq_kicks.insert(qpn);
    }

    /// The QP's rings are unreachable: QP fatal event, ERROR.
    fn qp_fatal(&mut self, qpn: u32, io: &mut DeviceIo<'_>) {
        let ev = crate::eq::aeqe(crate::eq::ae_type::QP_FATAL, 0, qpn, 0);
        self.async_event(io, ev);
        if let Some(qp) = self.qps.get_mut(&qpn) {
            qp.state = qps::ERROR;
            // Nothing more can be read from the ring.
            qp.sq_pi = qp.sq_ci;
            qp.rq_pi = qp.rq_ci;
            if let Some(e) = qp.engine.as_mut() {
                let _ = e.modify(roce_model::QpState::Error, &roce_model::QpAttr::default());
            }
        }
    }

    /// Executes one parsed SQE. `Ok(Some(len))`: complete now (CQE if
    /// signaled); `Ok(None)`: handed to the engine; `Err(status)`.
    fn execute_wqe(
        &mut self,
        qpn: u32,
        pd: u32,
        hdr: &SqeHdr,
        idx: u16,
        wqe: SendWqe,
        io: &mut DeviceIo<'_>,
    ) -> Result<Option<u32>, u8> {
        match wqe {
            SendWqe::LocalInv { stag } => {
                let mr = self
                    .mrs
                    .get_mut(stag >> 8)
                    .filter(|m| m.key == (stag & 0xff) as u8 && m.pd == pd)
                    .ok_or(wc_status::SEND_STAG_INVALID_ERR)?;
                mr.valid = false;
                self.counters.local_invs += 1;
                Ok(Some(0))
            }
            SendWqe::RegMr {
                addr,
                length,
                stag,
                access,
                mtt_type,
                mtt_cnt,
                inline_mtt,
            } => {
                let max_mtt = self.cfg.max_mtt_entries;
                let mr = self
                    .mrs
                    .get_mut(stag >> 8)
                    .filter(|m| m.mr_type == mr_type::FRMR && m.pd == pd)
                    .ok_or(wc_status::SEND_STAG_INVALID_ERR)?;
                let mtt = if mtt_type == 0 {
                    let mut entries = [0u64; 4];
                    for (e, v) in entries.iter_mut().zip(inline_mtt.iter()) {
                        *e = *v;
                    }
                    Mtt::Inline {
                        entries,
                        count: mtt_cnt.min(4),
                    }
                } else {
                    match mr.mtt {
                        Mtt::Table {
                            root,
                            count,
                            mtt_page_size,
                            ..
                        } if mtt_cnt <= count && mtt_cnt <= max_mtt => Mtt::Table {
                            root,
                            level: 1,
                            count: mtt_cnt,
                            mtt_page_size,
                        },
                        _ => return Err(wc_status::SEND_WQE_FORMAT_ERR),
                    }
                };
                if crate::mr::range_end(addr, u64::from(length)).is_none() {
                    return Err(wc_status::SEND_WQE_FORMAT_ERR);
                }
                let psize = 1u64 << mr.page_shift;
                let span = (addr & (psize - 1)) + u64::from(length);
                if span.div_ceil(psize) > u64::from(mtt_cnt) {
                    return Err(wc_status::SEND_WQE_FORMAT_ERR);
                }
                mr.mtt = mtt;
                mr.key = (stag & 0xff) as u8;
                mr.va = addr;
                mr.len = u64::from(length);
                mr.access = access | acc::LR;
                mr.valid = true;
                self.counters.fast_regs += 1;
                Ok(Some(0))
            }
            SendWqe::UdSend {
                imm,
                qkey,
                dst_qpn,
                ahn,
                payload,
                ..
            } => {
                let mtu = self.engine_mtu().bytes() as usize;
                let data = self.gather(io, pd, &payload, mtu)?;
                let ah = self
                    .ahs
                    .get(&ahn)
                    .copied()
                    .ok_or(wc_status::SEND_WQE_FORMAT_ERR)?;
                let psn = match self.qps.get_mut(&qpn) {
                    Some(qp) => {
                        let p = qp.ud_psn;
                        qp.ud_psn = (p + 1) & 0xff_ffff;
                        p
                    }
                    None => 0,
                };
                let opcode = if imm.is_some() {
                    Opcode::UdSendOnlyImm
                } else {
                    Opcode::UdSendOnly
                };
                let mut pkt = PacketBuilder::new(opcode, dst_qpn & 0xff_ffff, psn)
                    .se(hdr.se)
                    .deth(Deth { qkey, src_qp: qpn })
                    .payload(&data);
                if let Some(i) = imm {
                    pkt = pkt.imm(i);
                }
                if self.send_frame(&ah.av, &pkt, io).is_err() {
                    self.counters.tx_errors += 1;
                    return Err(wc_status::SEND_WQE_FORMAT_ERR);
                }
                Ok(Some(data.len() as u32))
            }
            other => self.post_to_engine(qpn, pd, hdr, idx, other).map(|_| None),
        }
    }

    fn post_to_engine(
        &mut self,
        qpn: u32,
        pd: u32,
        hdr: &SqeHdr,
        idx: u16,
        wqe: SendWqe,
    ) -> Result<(), u8> {
        let wr_id = self.next_wr_id;
        let mut invalidate = None;
        let wr = match wqe {
            SendWqe::Send {
                imm,
                invalidate: inv,
                payload,
                ..
            } => {
                let o = match (imm, inv) {
                    (Some(imm), _) => SendOp::SendWithImm { imm },
                    (None, Some(rkey)) => SendOp::SendWithInv { rkey },
                    _ => SendOp::Send,
                };
                self.send_wr(wr_id, o, pd, payload)?
            }
            SendWqe::Write {
                imm,
                rkey,
                remote_addr,
                payload,
                ..
            } => {
                let o = match imm {
                    Some(imm) => SendOp::RdmaWriteWithImm {
                        remote_addr,
                        rkey,
                        imm,
                    },
                    None => SendOp::RdmaWrite { remote_addr, rkey },
                };
                self.send_wr(wr_id, o, pd, payload)?
            }
            SendWqe::Read {
                invalidate: inv,
                length,
                sink_key,
                sink_addr,
                remote_addr,
                rkey,
            } => {
                // The sink is checked now so that a bad key fails early; the
                // response lands in it directly.
                self.check_local_sge(pd, sink_key, sink_addr, length, acc::LW)?;
                invalidate = inv;
                let sges = if length == 0 {
                    Vec::new()
                } else {
                    vec![Sge::new(sink_addr, length, sink_key)]
                };
                SendWr::new(wr_id, SendOp::RdmaRead { remote_addr, rkey }, sges)
            }
            SendWqe::Atomic {
                cas,
                swap_add,
                compare,
                remote_addr,
                rkey,
                local,
            } => {
                self.check_local_sge(pd, local.key, local.addr, 8, acc::LW)?;
                let o = if cas {
                    SendOp::AtomicCmpAndSwp {
                        remote_addr,
                        rkey,
                        compare,
                        swap: swap_add,
                    }
                } else {
                    SendOp::AtomicFetchAndAdd {
                        remote_addr,
                        rkey,
                        add: swap_add,
                    }
                };
                SendWr::new(wr_id, o, vec![Sge::new(local.addr, 8, local.key)])
            }
            _ => return Err(wc_status::SEND_WQE_FORMAT_ERR),
        };
        let wr = wr.signaled(true).solicited(hdr.se);
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return Err(wc_status::GENERAL_ERR);
        };
        match qp.engine.as_mut().map(|e| e.post_send(wr)) {
            Some(Ok(())) => {
                self.next_wr_id = self.next_wr_id.wrapping_add(1);
                qp.inflight.push_back(Inflight {
                    wr_id,
                    sq_idx: idx,
                    opcode: hdr.opcode,
                    signaled: hdr.ce,
                    invalidate,
                });
                self.engine_wrs += 1;
                Ok(())
            }
            _ => Err(wc_status::SEND_WQE_FORMAT_ERR),
        }
    }

    /// A SEND or WRITE work request: inline bytes travel with it, a gather
    /// list is checked now and read by the engine from guest memory.
    fn send_wr(&self, wr_id: u64, o: SendOp, pd: u32, payload: Payload) -> Result<SendWr, u8> {
        match payload {
            Payload::Inline(b) => Ok(SendWr::inline(wr_id, o, b)),
            Payload::Sgl(sges) => {
                let mut list = Vec::with_capacity(sges.len());
                for s in sges.iter().filter(|s| s.length > 0) {
                    self.check_local_sge(pd, s.key, s.addr, s.length, 0)?;
                    list.push(Sge::new(s.addr, s.length, s.key));
                }
                Ok(SendWr::new(wr_id, o, list))
            }
        }
    }

    /// The outer headers of a frame along `av` (the IPv4 ident is the next
    /// one; RC frames built in place take theirs from `next_ident`).
    fn frame_builder(&mut self, av: &Av) -> Result<FrameBuilder, ()> {
        let sgid = self
            .gids
            .get(usize::from(av.sgid_index))
            .copied()
            .flatten()
            .ok_or(())?;
        let ttl = if av.hop_limit == 0 {
            self.cfg.default_ttl
        } else {
            av.hop_limit
        };
        let net = match (ipv4_of_gid(&sgid.gid), av.dst_ipv4()) {
            (Some(src), Some(dst)) => NetParams::Ipv4 {
                src,
                dst,
                tos: av.traffic_class,
                ttl,
                ident: self.next_ident(),
                udp_src_port: av.udp_sport,
            },
            (None, None) => NetParams::Ipv6 {
                src: sgid.gid,
                dst: av.dgid,
                traffic_class: av.traffic_class,
                flow_label: av.flow_label,
                hop_limit: ttl,
                udp_src_port: av.udp_sport,
            },
            _ => return Err(()),
        };
        Ok(FrameBuilder {
            dst_mac: av.dmac,
            src_mac: self.cfg.mac,
            vlan_tci: None,
            net,
        })
    }

    fn next_ident(&mut self) -> u16 {
        self.ip_ident = self.ip_ident.wrapping_add(1);
        self.ip_ident
    }

    /// Counts and queues a finished frame along `av`, unless it is larger
    /// than the device sends: to the edge, or, when `av` names one of this
    /// function's own GIDs, to its loopback queue.
    fn push_frame(&mut self, av: &Av, mut frame: Vec<u8>, io: &mut DeviceIo<'_>) -> Result<(), ()> {
        if frame.len() > self.cfg.max_frame {
            return Err(());
        }
        if self.port_is_down() && !self.is_own_gid(&av.dgid) {
            // port-down: the frame goes nowhere (RC retransmits).
            self.counters.port_down_drops += 1;
            return Ok(());
        }
        self.counters.tx_frames += 1;
        self.counters.tx_bytes += frame.len() as u64;
        if self.is_own_gid(&av.dgid) {
            if self.loopback.len() >= 2 * self.cfg.max_tx_frames_per_poll {
                self.counters.loopback_drops += 1;
                return Ok(());
            }
            // Addressed to this function whatever MAC the AV gave (SMC-R
            // gives none).
            frame[..6].copy_from_slice(&self.cfg.mac);
            self.counters.loopback_frames += 1;
            self.loopback.push_back(frame);
            return Ok(());
        }
        io.tx.push(frame);
        Ok(())
    }

    fn is_own_gid(&self, gid: &[u8; 16]) -> bool {
        self.gids.iter().flatten().any(|g| &g.gid == gid)
    }

    /// Takes the frames this function sent to itself (QPs of one function
    /// talking to each other: the fabric never returns a frame to the port
    /// it came from, and a real RDMA NIC loops them back inside), at most
    /// one poll's budget of them; the rest wait for the next poll.
    pub(crate) fn run_loopback(&mut self, io: &mut DeviceIo<'_>) {
        for _ in 0..self.cfg.max_tx_frames_per_poll {
            let Some(f) = self.loopback.pop_front() else {
                return;
            };
            let _ = self.rx_frame(&f, None, io);
        }
    }

    /// Builds and sends one frame along `av`.
    pub(crate) fn send_frame(
        &mut self,
        av: &Av,
        pkt: &PacketBuilder<'_>,
        io: &mut DeviceIo<'_>,
    ) -> Result<(), ()> {
        let fb = self.frame_builder(av)?;
        let frame = fb.build(pkt).map_err(|_| ())?;
        self.push_frame(av, frame, io)
    }

    /// Completes WQE `idx` of `qpn`'s SQ or RQ (`qtype`) on `cqn` with
    /// FLUSH_ERR: what a QP in ERROR owes its driver for each posted WQE.
    fn flush_wqe(
        &mut self,
        io: &mut DeviceIo<'_>,
        cqn: u32,
        qpn: u32,
        qtype: u8,
        opcode: u8,
        idx: u16,
    ) {
        self.counters.wqes_flushed += 1;
        let cqe = Cqe {
            opcode,
            qtype,
            syndrome: wc_status::FLUSH_ERR,
            qe_idx: u32::from(idx),
            qpn,
            ..Cqe::default()
        };
        self.post_cqe(io, cqn, &cqe, false);
    }

    /// Moves RQEs of `qpn` into the engine (RC), or flushes them (ERROR).
    fn process_rq(&mut self, qpn: u32, io: &mut DeviceIo<'_>) -> bool {
        for _ in 0..self.cfg.poll_budget {
            if self.ring_posted(qpn, true).is_none() {
                return true;
            }
            let Some(qp) = self.qps.get(&qpn) else {
                return true;
            };
            let (state, ud, rcqn, idx) = (qp.state, qp.is_ud(), qp.rcqn, qp.rq_ci);
            if state != qps::ERROR
                && !ud
                && state != qps::RESET
                && !self.engine_has_room(qpn, false)
            {
                return true;
            }
            if state == qps::ERROR {
                if let Some(qp) = self.qps.get_mut(&qpn) {
                    qp.rq_ci = qp.rq_ci.wrapping_add(1);
                }
                self.flush_wqe(io, rcqn, qpn, qtype::RQ, op::RECEIVE, idx);
                continue;
            }
            if ud || state == qps::RESET {
                // UD RQEs are taken when a datagram arrives.
                return true;
            }
            let Ok(rqe) = self.read_rqe(qpn, idx, io) else {
                self.qp_fatal(qpn, io);
                return true;
            };
            let wr_id = self.next_wr_id;
            let sges = if rqe.length > 0 {
                vec![Sge::new(rqe.to, rqe.length, rqe.stag)]
            } else {
                Vec::new()
            };
            let Some(qp) = self.qps.get_mut(&qpn) else {
                return true;
            };
            let r = qp
                .engine
                .as_mut()
                .map(|e| e.post_recv(RecvWr::new(wr_id, sges)));
            match r {
                Some(Ok(())) => {
                    self.next_wr_id = self.next_wr_id.wrapping_add(1);
                    qp.rq_ci = qp.rq_ci.wrapping_add(1);
                    qp.recvs.push_back(RecvSlot { wr_id, rq_idx: idx });
                    self.engine_wrs += 1;
                    self.counters.rqes_consumed += 1;
                }
                _ => return true,
            }
        }
        false
    }

    fn read_rqe(&mut self, qpn: u32, idx: u16, io: &DeviceIo<'_>) -> Result<Rqe, ()> {
        let Some(qp) = self.qps.get(&qpn) else {
            return Err(());
        };
        let off = u64::from(u32::from(idx) & (qp.rq_depth - 1)) * crate::regs::RQE_SIZE;
        let mut b = [0u8; 32];
        if qp.rq.read(io.dma, off, &mut b).is_err() {
            self.counters.dma_errors += 1;
            return Err(());
        }
        Ok(Rqe::parse(&b))
    }

    /// Runs an RC engine: timers, transmit, completions. Each packet is
    /// written by the engine into its frame after the room for the outer
    /// headers, which are then filled in place: payload is copied once,
    /// from guest memory into the frame.
    fn pump_engine(&mut self, qpn: u32, io: &mut DeviceIo<'_>) {
        let now = io.now;
        let Some(av) = self.qps.get(&qpn).and_then(|q| q.av) else {
            // No path yet: still run the timers and hand out completions.
            self.engine_timers_and_completions(qpn, now, io);
            return;
        };
        let mut fb = self.frame_builder(&av).ok();
        let headroom = fb.map_or(0, |f| f.header_len());
        let mut sent = 0;
        loop {
            if sent >= self.cfg.poll_budget || self.tx_budget_spent(io) {
                break;
            }
            let mut frame = Vec::new();
            let (written, dma_errors) = {
                let Some(e) = self.qps.get_mut(&qpn).and_then(|q| q.engine.as_mut()) else {
                    return;
                };
                if e.poll_timeout().is_some_and(|t| t <= now) {
                    e.handle_timeout(now);
                }
                let store = GuestStore::new(&mut self.mrs, io.dma, self.cfg.local_dma_key);
                let w = e.poll_transmit_into(now, &store, &mut frame, headroom);
                (w, store.dma_errors())
            };
            self.counters.dma_errors += dma_errors;
            if !written {
                break;
            }
            sent += 1;
            let Some(f) = fb.as_mut() else {
                // The AV names no usable source GID: nothing can be sent.
                self.counters.tx_errors += 1;
                continue;
            };
            if let NetParams::Ipv4 { ident, .. } = &mut f.net {
                *ident = self.next_ident();
            }
            let ok = f.wrap_in_place(&mut frame).is_ok() && self.push_frame(&av, frame, io).is_ok();
            if !ok {
                self.counters.tx_errors += 1;
            }
        }
        if sent >= self.cfg.poll_budget || self.tx_budget_spent(io) {
            // Frames are left in the engine: come back after the edge has
            // forwarded this batch.
            self.tx_more = true;
        }
        self.engine_timers_and_completions(qpn, now, io);
    }

    /// May this call make no more frames: it made as many as one call may,
    /// or the edge's receivers are full (`DeviceIo::tx_paused`)?
    fn tx_budget_spent(&self, io: &DeviceIo<'_>) -> bool {
        io.tx_paused || io.tx.len() >= self.cfg.max_tx_frames_per_poll
    }

    fn engine_timers_and_completions(&mut self, qpn: u32, now: Instant, io: &mut DeviceIo<'_>) {
        let mut comps = Vec::new();
        if let Some(e) = self.qps.get_mut(&qpn).and_then(|q| q.engine.as_mut()) {
            if e.poll_timeout().is_some_and(|t| t <= now) {
                e.handle_timeout(now);
            }
            while let Some(c) = e.poll_completion() {
                comps.push(c);
            }
        }
        for c in comps {
            self.engine_completion(qpn, c, io);
        }
    }

    fn engine_completion(&mut self, qpn: u32, c: roce_model::Completion, io: &mut DeviceIo<'_>) {
        if !matches!(c.status, WcStatus::Success | WcStatus::WrFlushErr) {
            // kept for `ctl status`: the RC engine's own reason
            self.last_error_completion = Some(format!(
                "QP {qpn}: RC engine completed {:?} with {:?}",
                c.opcode, c.status
            ));
        }
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        let (scqn, rcqn) = (qp.scqn, qp.rcqn);
        if c.is_recv() || c.opcode == WcOpcode::Recv {
            let Some(pos) = qp.recvs.iter().position(|r| r.wr_id == c.wr_id) else {
                return;
            };
            let Some(slot) = qp.recvs.remove(pos) else {
                return;
            };
            self.engine_wr_done();
            let st = engine_status(c.status, false);
            // SEND with invalidate: the engine invalidated the driver's MR
            // through the store when the message arrived.
            let inv_rkey = c.invalidated_rkey;
            let opcode = match (c.opcode, c.imm, inv_rkey) {
                (WcOpcode::RecvRdmaWithImm, _, _) => op::RECV_IMM,
                (_, Some(_), _) => op::RSP_SEND_IMM,
                (_, _, Some(_)) => op::RECV_INV,
                _ => op::RECEIVE,
            };
            let cqe = Cqe {
                opcode,
                qtype: qtype::RQ,
                syndrome: st,
                qe_idx: u32::from(slot.rq_idx),
                qpn,
                imm: c.imm.unwrap_or(0),
                inv_rkey,
                size: c.byte_len,
                ud_info: 0,
            };
            if st != wc_status::SUCCESS && st != wc_status::FLUSH_ERR {
                self.enter_error(qpn);
            }
            self.post_cqe(io, rcqn, &cqe, false);
            return;
        }
        let Some(pos) = qp.inflight.iter().position(|i| i.wr_id == c.wr_id) else {
            return;
        };
        let Some(inf) = qp.inflight.remove(pos) else {
            return;
        };
        if qp.inflight.is_empty() && qp.sq_wait_drain {
            qp.sq_wait_drain = false;
            self.sq_kicks.insert(qpn);
        }
        self.engine_wr_done();
        let st = engine_status(c.status, true);
        if st == wc_status::SUCCESS {
            if let Some(k) = inf.invalidate {
                if let Some(mr) = self.mrs.get_mut(k >> 8) {
                    mr.valid = false;
                }
            }
        }
        if inf.signaled || st != wc_status::SUCCESS {
            let cqe = Cqe {
                opcode: inf.opcode,
                qtype: qtype::SQ,
                syndrome: st,
                qe_idx: u32::from(inf.sq_idx),
                qpn,
                size: c.byte_len,
                ..Cqe::default()
            };
            self.post_cqe(io, scqn, &cqe, false);
        }
        if st != wc_status::SUCCESS && st != wc_status::FLUSH_ERR {
            self.enter_error(qpn);
        }
    }

    /// A frame from the fabric, with the view the edge handed with it
    /// (its RoCE layers are read from the view's offsets: the L2-L4 walk is
    /// not done again), or a frame this function looped back to itself
    /// (`view` None: it never passed the fabric, so it is parsed here,
    /// once).
    pub(crate) fn rx_frame(
        &mut self,
        frame: &[u8],
        view: Option<&pci_model::ParsedFrame>,
        io: &mut DeviceIo<'_>,
    ) -> Result<(), RxRefusal> {
        let parsed = if frame.len() > self.cfg.max_frame {
            None
        } else {
            match view {
                Some(v) => RoceFrame::from_parsed(frame, v).ok(),
                None => RoceFrame::parse(frame).ok(),
            }
        };
        let Some(f) = parsed else {
            self.counters.rx_dropped += 1;
            self.counters.rx_drop_not_roce += 1;
            return Err(RxRefusal::Dropped);
        };
        let multicast = f.eth.dst[0] & 1 != 0;
        if (!multicast && f.eth.dst != self.cfg.mac) || matches!(f.net, NetLayer::Grh { .. }) {
            self.counters.rx_dropped += 1;
            self.counters.rx_drop_wrong_dest += 1;
            return Err(RxRefusal::Dropped);
        }
        if f.verify_icrc().is_err() {
            self.counters.rx_dropped += 1;
            self.counters.rx_drop_bad_icrc += 1;
            return Err(RxRefusal::Dropped);
        }
        let qpn = f.packet.bth.dest_qp;
        let Some(qp) = self.qps.get(&qpn) else {
            self.counters.rx_dropped += 1;
            self.counters.rx_drop_unknown_qp += 1;
            return Err(RxRefusal::Dropped);
        };
        let transport = f.packet.bth.opcode.transport();
        let r = match (transport, qp.is_ud()) {
            (Transport::Ud, true) => {
                let r = self.ud_receive(qpn, &f, io);
                if r.is_err() {
                    self.counters.rx_drop_ud += 1;
                }
                r
            }
            (Transport::Rc, false) => {
                let now = io.now;
                let Some(e) = self.qps.get_mut(&qpn).and_then(|q| q.engine.as_mut()) else {
                    return Err(RxRefusal::Dropped);
                };
                let mut store = GuestStore::new(&mut self.mrs, io.dma, self.cfg.local_dma_key);
                let res = e.handle_packet(&f.packet, now, &mut store);
                self.counters.dma_errors += store.dma_errors();
                let ok = res.is_ok();
                if let Err(error) = res {
                    // kept for `ctl status` (formatted there: under loss this
                    // runs for most frames)
                    self.last_rx_refusal = Some(RxRefusalNote {
                        qpn,
                        opcode: f.packet.bth.opcode,
                        error: Some(error),
                    });
                }
                self.pump_engine(qpn, io);
                if ok {
                    Ok(())
                } else {
                    self.counters.rx_drop_refused_by_qp += 1;
                    Err(RxRefusal::Dropped)
                }
            }
            _ => {
                self.counters.rx_drop_wrong_transport += 1;
                Err(RxRefusal::Dropped)
            }
        };
        match r {
            Ok(()) => {
                self.counters.rx_frames += 1;
                self.counters.rx_bytes += frame.len() as u64;
            }
            Err(_) => self.counters.rx_dropped += 1,
        }
        r
    }

    fn ud_receive(
        &mut self,
        qpn: u32,
        f: &RoceFrame<'_>,
        io: &mut DeviceIo<'_>,
    ) -> Result<(), RxRefusal> {
        let Some(qp) = self.qps.get(&qpn) else {
            return Err(RxRefusal::Dropped);
        };
        let deth = f.packet.ext.deth.ok_or(RxRefusal::Dropped)?;
        if qp.state != qps::RTR && qp.state != qps::RTS {
            return Err(RxRefusal::Dropped);
        }
        if deth.qkey != qp.qkey {
            return Err(RxRefusal::Dropped);
        }
        if qp.posted(true).is_none_or(|n| n == 0) {
            return Err(RxRefusal::NoBuffers);
        }
        let (pd, rcqn, idx) = (qp.pd, qp.rcqn, qp.rq_ci);
        let Ok(rqe) = self.read_rqe(qpn, idx, io) else {
            self.qp_fatal(qpn, io);
            return Err(RxRefusal::Dropped);
        };
        if let Some(qp) = self.qps.get_mut(&qpn) {
            qp.rq_ci = qp.rq_ci.wrapping_add(1);
        }
        self.counters.rqes_consumed += 1;
        // 40-byte GRH area: IPv6 header, or 20 zero bytes + IPv4 header.
        let mut grh = [0u8; 40];
        let ntype = match f.net {
            NetLayer::Ipv4 { ip_raw, .. } => {
                let n = ip_raw.len().min(20);
                grh[20..20 + n].copy_from_slice(&ip_raw[..n]);
                0u32
            }
            NetLayer::Ipv6 { ip_raw, .. } => {
                let n = ip_raw.len().min(40);
                grh[..n].copy_from_slice(&ip_raw[..n]);
                1
            }
            NetLayer::Grh { .. } => return Err(RxRefusal::Dropped),
        };
        let payload = f.packet.payload;
        let total = 40 + payload.len();
        let mut st = wc_status::SUCCESS;
        if total > rqe.length as usize {
            st = wc_status::RECV_ADDR_VIOLATION_ERR;
        } else {
            let mut data = Vec::with_capacity(total);
            data.extend_from_slice(&grh);
            data.extend_from_slice(payload);
            if let Err(e) = self.write_local(io.dma, pd, rqe.stag, rqe.to, &data) {
                if matches!(e, XlateError::Dma(_)) {
                    self.counters.dma_errors += 1;
                }
                st = xlate_status(&e, false);
            }
        }
        let imm = f.packet.ext.imm_dt.map(|i| i.imm);
        let cqe = Cqe {
            opcode: if imm.is_some() {
                op::RSP_SEND_IMM
            } else {
                op::RECEIVE
            },
            qtype: qtype::RQ,
            syndrome: st,
            qe_idx: u32::from(idx),
            qpn,
            imm: imm.unwrap_or(0),
            inv_rkey: None,
            size: total as u32,
            ud_info: (ntype << 31) | (deth.src_qp & 0xf_ffff),
        };
        self.post_cqe(io, rcqn, &cqe, f.packet.bth.se);
        Ok(())
    }
}
