//! Responder (rxe `rxe_resp.c`): PSN check, opcode sequencing, validity,
//! resources (RQ/SRQ, READ/atomic ring), length and rkey checks, execution,
//! acknowledgement, duplicate replay, and class A/C errors.

use std::time::Instant;

use super::{
    emit, sg_len, sg_write, InMsg, QpError, QpState, QueuePair, ReadReply, RespOut, RespRes, Slot,
    TakenRecv, WcOpcode, WcStatus, CREDITS_INVALID, MAX_MSG_LEN,
};
use crate::headers::{Aeth, AethSyndrome, AtomicAckEth, Bth, NakCode};
use crate::mr::{Access, MemoryStore};
use crate::opcode::{OpKind, Opcode};
use crate::packet::{ExtHeaders, RocePacket};
use crate::psn::Psn;

const ACK: AethSyndrome = AethSyndrome::Ack {
    credits: CREDITS_INVALID,
};

impl QueuePair {
    fn resp_out_cap(&self) -> usize {
        usize::from(self.attr.max_dest_rd_atomic) + 64
    }

    fn bump_msn(&mut self) {
        self.resp.msn = (self.resp.msn + 1) & 0xff_ffff;
        self.stats.messages_received += 1;
    }

    /// Queue an ACK for `psn`, coalescing with a queued ACK (ACKs are cumulative).
    fn queue_ack(&mut self, psn: Psn) {
        let msn = self.resp.msn;
        if let Some(RespOut::Ack {
            psn: p,
            syndrome: AethSyndrome::Ack { .. },
            msn: m,
        }) = self.resp.out.back_mut()
        {
            if !psn.is_before(*p) {
                *p = psn;
                *m = msn;
                return;
            }
        }
        self.resp.out.push_back(RespOut::Ack {
            psn,
            syndrome: ACK,
            msn,
        });
    }

    fn queue_nak(&mut self, psn: Psn, syndrome: AethSyndrome) {
        self.resp.out.push_back(RespOut::Ack {
            psn,
            syndrome,
            msn: self.resp.msn,
        });
    }

    /// Class A/C error: complete a held receive WQE with `status`, move the
    /// QP to ERROR (flushing the rest) and send one NAK.
    fn class_ac_error(&mut self, psn: Psn, code: NakCode, status: WcStatus) -> Result<(), QpError> {
        if let Some(r) = self.resp.recv.take() {
            self.push_recv_completion(&r.wr, r.slot, status, r.offset, None, None);
        }
        self.enter_error();
        self.queue_nak(psn, AethSyndrome::Nak { code });
        Ok(())
    }

    fn push_resource(&mut self, res: RespRes) {
        let cap = usize::from(self.attr.max_dest_rd_atomic).max(1);
        while self.resp.resources.len() >= cap {
            self.resp.resources.pop_front();
        }
        self.resp.resources.push_back(res);
    }

    pub(super) fn handle_request(
        &mut self,
        pkt: &RocePacket<'_>,
        _now: Instant,
        mem: &mut dyn MemoryStore,
    ) -> Result<(), QpError> {
        if !matches!(self.state, QpState::Rtr | QpState::Rts) {
            return Err(QpError::Dropped("request while not RTR/RTS"));
        }
        if self.resp.out.len() >= self.resp_out_cap() {
            // Back-pressure: the requester will retransmit.
            return Err(QpError::Dropped("responder output queue full"));
        }
        // CHK_PSN
        let psn = Psn::new(pkt.bth.psn);
        let diff = psn.diff(self.resp.psn);
        if diff > 0 {
            if self.resp.sent_psn_nak {
                self.stats.out_of_seq_dropped += 1;
                return Err(QpError::Dropped("out of sequence (NAK already sent)"));
            }
            self.resp.sent_psn_nak = true;
            self.stats.seq_naks_sent += 1;
            self.queue_nak(
                self.resp.psn,
                AethSyndrome::Nak {
                    code: NakCode::PsnSequenceError,
                },
            );
            return Ok(());
        }
        if diff < 0 {
            return self.duplicate_request(pkt, psn);
        }
        self.resp.sent_psn_nak = false;

        let info = pkt.info();
        let (kind, pos) = (info.kind, info.position);
        let pmtu = self.pmtu();
        let pd = self.pd;
        let inv =
            |qp: &mut Self| qp.class_ac_error(psn, NakCode::InvalidRequest, WcStatus::RemInvReqErr);
        let acc = |qp: &mut Self| {
            qp.class_ac_error(psn, NakCode::RemoteAccessError, WcStatus::RemAccessErr)
        };

        // CHK_OP_SEQ
        let seq_ok = match self.resp.in_msg {
            InMsg::None => pos.starts(),
            InMsg::Send => kind == OpKind::Send && !pos.starts(),
            InMsg::Write { .. } => kind == OpKind::Write && !pos.starts(),
        };
        if !seq_ok {
            return inv(self);
        }
        // CHK_OP_VALID
        let need = match kind {
            OpKind::Send => Access::NONE,
            OpKind::Write => Access::REMOTE_WRITE,
            OpKind::ReadRequest => Access::REMOTE_READ,
            OpKind::Atomic => Access::REMOTE_ATOMIC,
            // FLUSH and ATOMIC_WRITE are not implemented.
            _ => return inv(self),
        };
        if !self.attr.access.contains(need) {
            return inv(self);
        }
        // CHK_RESOURCE
        if matches!(kind, OpKind::ReadRequest | OpKind::Atomic) && self.attr.max_dest_rd_atomic == 0
        {
            return inv(self);
        }
        let needs_recv =
            kind == OpKind::Send || (kind == OpKind::Write && pkt.ext.imm_dt.is_some());
        if needs_recv && self.resp.recv.is_none() {
            let taken = match &self.srq {
                Some(srq) => srq.take().map(|wr| (wr, Slot::Srq)),
                None => self.rq.pop_front().map(|wr| (wr, Slot::Recv)),
            };
            match taken {
                Some((wr, slot)) => {
                    self.resp.recv = Some(TakenRecv {
                        wr,
                        slot,
                        offset: 0,
                    })
                }
                None => {
                    self.stats.rnr_naks_sent += 1;
                    self.queue_nak(
                        psn,
                        AethSyndrome::RnrNak {
                            timer: self.attr.min_rnr_timer,
                        },
                    );
                    return Ok(());
                }
            }
        }
        // CHK_LENGTH
        let plen = pkt.payload.len();
        if !info.payload.check(plen, pmtu as usize) {
            return inv(self);
        }
        if pkt.ext.reth.is_some_and(|r| u64::from(r.len) > MAX_MSG_LEN) {
            return inv(self);
        }
        match (kind, self.resp.in_msg) {
            (OpKind::Send, _) => {
                let fits =
                    self.resp.recv.as_ref().is_some_and(|r| {
                        u64::from(r.offset) + plen as u64 <= sg_len(&r.wr.sg_list)
                    });
                if !fits {
                    return self.class_ac_error(psn, NakCode::InvalidRequest, WcStatus::LocLenErr);
                }
            }
            (OpKind::Write, m) => {
                let resid = match (m, pkt.ext.reth) {
                    (InMsg::Write { resid, .. }, _) => resid,
                    (_, Some(reth)) => reth.len,
                    _ => return inv(self),
                };
                let ok = if pos.ends() {
                    plen as u64 == u64::from(resid)
                } else {
                    (plen as u64) < u64::from(resid)
                };
                if !ok {
                    return inv(self);
                }
            }
            _ => {}
        }
        // CHK_RKEY (zero-length READ/WRITE skip it)
        match kind {
            OpKind::Write | OpKind::ReadRequest if pos.starts() => {
                let Some(reth) = pkt.ext.reth else {
                    return inv(self);
                };
                if reth.len > 0
                    && mem
                        .check_remote(pd, reth.rkey, reth.va, reth.len.into(), need)
                        .is_err()
                {
                    return acc(self);
                }
            }
            OpKind::Atomic => {
                let Some(a) = pkt.ext.atomic_eth else {
                    return inv(self);
                };
                if a.va & 7 != 0 {
                    return inv(self);
                }
                if mem.check_remote(pd, a.rkey, a.va, 8, need).is_err() {
                    return acc(self);
                }
            }
            _ => {}
        }

        // EXECUTE
        match kind {
            OpKind::Send => {
                let Some(r) = self.resp.recv.as_mut() else {
                    return inv(self);
                };
                if plen > 0
                    && sg_write(mem, pd, &r.wr.sg_list, u64::from(r.offset), pkt.payload).is_err()
                {
                    return self.class_ac_error(
                        psn,
                        NakCode::RemoteOperationalError,
                        WcStatus::LocProtErr,
                    );
                }
                r.offset += plen as u32;
                self.resp.psn = psn.next();
                if pos.ends() {
                    let mut invalidated = None;
                    if let Some(ieth) = pkt.ext.ieth {
                        if mem.invalidate_in(pd, ieth.rkey).is_err() {
                            return self.class_ac_error(
                                psn,
                                NakCode::RemoteOperationalError,
                                WcStatus::LocQpOpErr,
                            );
                        }
                        invalidated = Some(ieth.rkey);
                    }
                    let imm = pkt.ext.imm_dt.map(|i| i.imm);
                    if !self.complete_recv(None, imm, (WcOpcode::Recv, invalidated)) {
                        return inv(self);
                    }
                    self.bump_msn();
                    self.resp.in_msg = InMsg::None;
                } else {
                    self.resp.in_msg = InMsg::Send;
                }
            }
            OpKind::Write => {
                let (va, rkey, resid, total) = match (self.resp.in_msg, pkt.ext.reth) {
                    (
                        InMsg::Write {
                            va,
                            rkey,
                            resid,
                            total,
                        },
                        _,
                    ) => (va, rkey, resid, total),
                    (_, Some(r)) => (r.va, r.rkey, r.len, r.len),
                    _ => return inv(self),
                };
                if plen > 0 {
                    let wrote = mem
                        .check_remote(pd, rkey, va, plen as u64, Access::REMOTE_WRITE)
                        .and_then(|span| mem.write_span(&span, 0, pkt.payload));
                    if wrote.is_err() {
                        return acc(self);
                    }
                }
                self.resp.psn = psn.next();
                if pos.ends() {
                    if let Some(imm) = pkt.ext.imm_dt {
                        let op = (WcOpcode::RecvRdmaWithImm, None);
                        if !self.complete_recv(Some(total), Some(imm.imm), op) {
                            return inv(self);
                        }
                    }
                    self.bump_msn();
                    self.resp.in_msg = InMsg::None;
                } else {
                    self.resp.in_msg = InMsg::Write {
                        va: va.wrapping_add(plen as u64),
                        rkey,
                        resid: resid - plen as u32,
                        total,
                    };
                }
            }
            OpKind::ReadRequest => {
                let Some(reth) = pkt.ext.reth else {
                    return inv(self);
                };
                let n = Psn::packets_for(reth.len.into(), pmtu);
                self.bump_msn();
                self.push_resource(RespRes::Read {
                    first_psn: psn,
                    last_psn: psn.add(n - 1),
                    va: reth.va,
                    rkey: reth.rkey,
                    len: reth.len,
                });
                self.resp.out.push_back(RespOut::Read(ReadReply {
                    res_psn: psn,
                    psn,
                    va: reth.va,
                    rkey: reth.rkey,
                    remaining: reth.len,
                    started: false,
                    msn: self.resp.msn,
                }));
                self.resp.psn = psn.add(n);
                return Ok(());
            }
            OpKind::Atomic => {
                let Some(a) = pkt.ext.atomic_eth else {
                    return inv(self);
                };
                let mut cur = [0u8; 8];
                let done = mem
                    .check_remote(pd, a.rkey, a.va, 8, Access::REMOTE_ATOMIC)
                    .and_then(|span| {
                        mem.read_span(&span, 0, &mut cur)?;
                        let orig = u64::from_le_bytes(cur);
                        let new = if pkt.bth.opcode == Opcode::RcCompareSwap {
                            if orig == a.compare {
                                a.swap_add
                            } else {
                                orig
                            }
                        } else {
                            orig.wrapping_add(a.swap_add)
                        };
                        mem.write_span(&span, 0, &new.to_le_bytes())?;
                        Ok(orig)
                    });
                let Ok(orig) = done else {
                    return acc(self);
                };
                self.stats.atomics_executed += 1;
                self.bump_msn();
                self.push_resource(RespRes::Atomic { psn, orig });
                self.resp.out.push_back(RespOut::AtomicAck {
                    psn,
                    orig,
                    msn: self.resp.msn,
                });
                self.resp.psn = psn.next();
                return Ok(());
            }
            _ => return inv(self),
        }
        if pkt.bth.ack_req {
            self.queue_ack(psn);
        }
        Ok(())
    }

    /// A request with a PSN before the expected one (rxe `duplicate_request`).
    fn duplicate_request(&mut self, pkt: &RocePacket<'_>, psn: Psn) -> Result<(), QpError> {
        self.stats.duplicates += 1;
        match pkt.info().kind {
            OpKind::Send | OpKind::Write => {
                // C9-105: ACK again (everything up to the last PSN received), don't execute.
                self.queue_ack(self.resp.psn.sub(1));
                Ok(())
            }
            OpKind::ReadRequest => {
                let Some(reth) = pkt.ext.reth else {
                    return Err(QpError::Dropped("READ without RETH"));
                };
                let found = self.resp.resources.iter().rev().find_map(|r| match *r {
                    RespRes::Read {
                        first_psn,
                        last_psn,
                        va,
                        rkey,
                        len,
                    } if !psn.is_before(first_psn) && !psn.is_after(last_psn) => {
                        Some((first_psn, va, rkey, len))
                    }
                    _ => None,
                });
                let Some((res_psn, va, rkey, len)) = found else {
                    return Err(QpError::Dropped("duplicate READ without a resource"));
                };
                let inside = reth.rkey == rkey
                    && reth.va >= va
                    && reth
                        .va
                        .checked_add(reth.len.into())
                        .zip(va.checked_add(len.into()))
                        .is_some_and(|(new_end, old_end)| new_end <= old_end);
                if !inside {
                    return Err(QpError::Dropped("duplicate READ outside the original"));
                }
                let replay = ReadReply {
                    res_psn,
                    psn,
                    va: reth.va,
                    rkey,
                    remaining: reth.len,
                    started: false,
                    msn: self.resp.msn,
                };
                self.stats.read_replays += 1;
                let queued = self
                    .resp
                    .out
                    .iter_mut()
                    .find(|o| matches!(o, RespOut::Read(r) if r.res_psn == res_psn));
                match queued {
                    Some(slot) => *slot = RespOut::Read(replay),
                    None => self.resp.out.push_back(RespOut::Read(replay)),
                }
                Ok(())
            }
            OpKind::Atomic => {
                let orig = self.resp.resources.iter().rev().find_map(|r| match *r {
                    RespRes::Atomic { psn: p, orig } if p == psn => Some(orig),
                    _ => None,
                });
                let Some(orig) = orig else {
                    return Err(QpError::Dropped("duplicate atomic without a resource"));
                };
                self.stats.atomic_replays += 1;
                self.resp.out.push_back(RespOut::AtomicAck {
                    psn,
                    orig,
                    msn: self.resp.msn,
                });
                Ok(())
            }
            _ => Err(QpError::Dropped("duplicate of an unsupported request")),
        }
    }

    /// The next response packet (ACK / NAK / atomic ACK / READ response).
    pub(super) fn next_response(
        &mut self,
        mem: &dyn MemoryStore,
        out: &mut Vec<u8>,
        headroom: usize,
    ) -> bool {
        let dest = self.attr.dest_qpn;
        loop {
            let Some(&item) = self.resp.out.front() else {
                return false;
            };
            match item {
                RespOut::Ack { psn, syndrome, msn } => {
                    self.resp.out.pop_front();
                    let ext = ExtHeaders {
                        aeth: Some(Aeth { syndrome, msn }),
                        ..Default::default()
                    };
                    let bth = Bth::new(Opcode::RcAcknowledge, dest, psn.value());
                    return emit(bth, &ext, 0, out, headroom, |_| Ok(())).is_ok();
                }
                RespOut::AtomicAck { psn, orig, msn } => {
                    self.resp.out.pop_front();
                    let ext = ExtHeaders {
                        aeth: Some(Aeth { syndrome: ACK, msn }),
                        atomic_ack_eth: Some(AtomicAckEth { orig }),
                        ..Default::default()
                    };
                    let bth = Bth::new(Opcode::RcAtomicAcknowledge, dest, psn.value());
                    return emit(bth, &ext, 0, out, headroom, |_| Ok(())).is_ok();
                }
                RespOut::Read(mut r) => {
                    let pmtu = self.pmtu();
                    let n = r.remaining.min(pmtu);
                    let last = r.remaining <= pmtu;
                    let opcode = match (r.started, last) {
                        (false, true) => Opcode::RcReadResponseOnly,
                        (false, false) => Opcode::RcReadResponseFirst,
                        (true, false) => Opcode::RcReadResponseMiddle,
                        (true, true) => Opcode::RcReadResponseLast,
                    };
                    let mut ext = ExtHeaders::default();
                    if opcode != Opcode::RcReadResponseMiddle {
                        ext.aeth = Some(Aeth {
                            syndrome: ACK,
                            msn: r.msn,
                        });
                    }
                    let bth = Bth::new(opcode, dest, r.psn.value());
                    let pd = self.pd;
                    let built = emit(bth, &ext, n as usize, out, headroom, |dst| {
                        if dst.is_empty() {
                            return Ok(());
                        }
                        let span =
                            mem.check_remote(pd, r.rkey, r.va, n.into(), Access::REMOTE_READ)?;
                        mem.read_span(&span, 0, dst)
                    });
                    match built {
                        Ok(()) => {
                            r.started = true;
                            r.psn = r.psn.next();
                            r.va = r.va.wrapping_add(n.into());
                            r.remaining -= n;
                            if last {
                                self.resp.out.pop_front();
                            } else if let Some(front) = self.resp.out.front_mut() {
                                *front = RespOut::Read(r);
                            }
                            return true;
                        }
                        Err(_) => {
                            // The region went away mid-READ: class C remote access error.
                            let _ = self.class_ac_error(
                                r.psn,
                                NakCode::RemoteAccessError,
                                WcStatus::RemAccessErr,
                            );
                        }
                    }
                }
            }
        }
    }
}
