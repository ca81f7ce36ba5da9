//! Completer (rxe `rxe_comp.c`): consumes ACKs, NAKs, READ responses and
//! atomic ACKs; completes send WQEs; drives retry, RNR wait and errors.

use std::time::{Duration, Instant};

use super::{sg_write, QpError, QpState, QueuePair, SendOp, WcStatus};
use crate::headers::{rnr_timer_usec, AethSyndrome, NakCode};
use crate::mr::MemoryStore;
use crate::opcode::{OpKind, Position};
use crate::packet::RocePacket;
use crate::psn::Psn;

impl QueuePair {
    pub(super) fn handle_response(
        &mut self,
        pkt: &RocePacket<'_>,
        now: Instant,
        mem: &mut dyn MemoryStore,
    ) -> Result<(), QpError> {
        if self.state != QpState::Rts {
            return Err(QpError::Dropped("response while not RTS"));
        }
        let info = pkt.info();
        let pmtu = self.pmtu();
        if !info.payload.check(pkt.payload.len(), pmtu as usize) {
            self.stats.responses_ignored += 1;
            return Err(QpError::Dropped("response payload breaks the PMTU rule"));
        }
        let psn = Psn::new(pkt.bth.psn);
        let syndrome = pkt.ext.aeth.map(|a| a.syndrome);

        if psn.is_before(self.comp.psn) {
            // Old response: only an ACK naming the head WQE's last PSN still
            // completes it (rxe check_psn); everything else is stale.
            let head_done = matches!(syndrome, Some(AethSyndrome::Ack { .. }))
                && info.kind == OpKind::Ack
                && self
                    .sq
                    .front()
                    .is_some_and(|w| w.sent && w.last_psn == psn && !w.wr.op.is_read_or_atomic());
            if head_done {
                self.complete_front(WcStatus::Success);
                self.after_progress(now);
                return Ok(());
            }
            self.stats.responses_ignored += 1;
            return Ok(());
        }

        // Everything wholly before `psn` is implicitly acknowledged.
        let mut progressed = false;
        loop {
            let Some(w) = self.sq.front() else {
                self.stats.responses_ignored += 1;
                if progressed {
                    self.after_progress(now);
                }
                return Err(QpError::Dropped("response with nothing outstanding"));
            };
            if !w.assigned {
                self.stats.responses_ignored += 1;
                if progressed {
                    self.after_progress(now);
                }
                return Err(QpError::Dropped("response for an unsent request"));
            }
            if !psn.is_after(w.last_psn) {
                break;
            }
            if w.wr.op.is_read_or_atomic() {
                // The peer moved past a READ/atomic whose response we lack.
                if progressed {
                    self.after_progress(now);
                }
                self.error_retry(false);
                return Ok(());
            }
            if !w.sent {
                self.stats.responses_ignored += 1;
                return Err(QpError::Dropped("response beyond what was sent"));
            }
            self.complete_front(WcStatus::Success);
            progressed = true;
        }

        let (op, first_psn, last_psn, sent) = {
            let w = &self.sq[0];
            (w.wr.op, w.first_psn, w.last_psn, w.sent)
        };
        match info.kind {
            OpKind::Ack => {
                let Some(syn) = syndrome else {
                    return Err(QpError::Dropped("ACK without AETH"));
                };
                match syn {
                    AethSyndrome::Ack { .. } => {
                        if !op.is_read_or_atomic() && !psn.is_before(first_psn) {
                            if psn == last_psn && sent {
                                self.complete_front(WcStatus::Success);
                            } else {
                                self.comp.psn = psn.next();
                            }
                            progressed = true;
                        }
                        if progressed {
                            self.after_progress(now);
                        }
                    }
                    AethSyndrome::RnrNak { timer } => {
                        self.stats.rnr_naks_received += 1;
                        if psn.is_after(self.comp.psn) {
                            self.comp.psn = psn;
                            progressed = true;
                        }
                        if progressed {
                            self.after_progress(now);
                        }
                        self.rnr_retry(now, timer);
                    }
                    AethSyndrome::Nak {
                        code: NakCode::PsnSequenceError,
                    } => {
                        self.stats.seq_naks_received += 1;
                        if psn.is_after(self.comp.psn) {
                            self.comp.psn = psn;
                            progressed = true;
                        }
                        if progressed {
                            self.after_progress(now);
                        }
                        // While waiting out an RNR NAK the rewind is already due.
                        if self.req.rnr_until.is_none() {
                            self.error_retry(false);
                        }
                    }
                    AethSyndrome::Nak { code } => {
                        let status = match code {
                            NakCode::InvalidRequest | NakCode::InvalidRdRequest => {
                                WcStatus::RemInvReqErr
                            }
                            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                            NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                            _ => WcStatus::BadRespErr,
                        };
                        self.fail_front(status);
                    }
                    AethSyndrome::Reserved { .. } => {
                        self.stats.responses_ignored += 1;
                        return Err(QpError::Dropped("reserved AETH syndrome"));
                    }
                }
                Ok(())
            }
            OpKind::AtomicAck => {
                if !op.is_atomic() || psn != first_psn {
                    self.stats.responses_ignored += 1;
                    if progressed {
                        self.after_progress(now);
                    }
                    return Err(QpError::Dropped("unexpected atomic ACK"));
                }
                let orig = pkt.ext.atomic_ack_eth.map_or(0, |a| a.orig);
                let sges = &self.sq[0].wr.sg_list;
                if sg_write(mem, self.pd, sges, 0, &orig.to_le_bytes()).is_err() {
                    self.fail_front(WcStatus::LocProtErr);
                    return Ok(());
                }
                self.complete_front(WcStatus::Success);
                self.after_progress(now);
                Ok(())
            }
            OpKind::ReadResponse => {
                let res = self.read_response(pkt, psn, mem);
                if progressed || res == ReadOutcome::Progress {
                    self.after_progress(now);
                }
                match res {
                    ReadOutcome::Ignored(why) => {
                        self.stats.responses_ignored += 1;
                        Err(QpError::Dropped(why))
                    }
                    _ => Ok(()),
                }
            }
            _ => Err(QpError::Dropped("not a response")),
        }
    }

    /// Place one READ response into the head WQE.
    fn read_response(
        &mut self,
        pkt: &RocePacket<'_>,
        psn: Psn,
        mem: &mut dyn MemoryStore,
    ) -> ReadOutcome {
        let pmtu = self.pmtu();
        let pd = self.pd;
        let w = &self.sq[0];
        if !matches!(w.wr.op, SendOp::RdmaRead { .. }) {
            return ReadOutcome::Ignored("READ response for a non-READ WQE");
        }
        let expected = w.first_psn.add(w.read_done / pmtu);
        if psn != expected {
            // Duplicate (already placed) or future (a response was lost:
            // wait for the retransmit timer, as rxe does).
            return ReadOutcome::Ignored("READ response out of sequence");
        }
        let pos = pkt.info().position;
        let seq_ok = if w.read_restart {
            pos.starts()
        } else {
            matches!(pos, Position::Middle | Position::Last)
        };
        if !seq_ok {
            return ReadOutcome::Ignored("READ response opcode out of sequence");
        }
        if pkt.ext.aeth.is_some_and(|a| !a.syndrome.is_ack()) {
            return ReadOutcome::Ignored("READ response with a NAK syndrome");
        }
        let done = w.read_done;
        let remaining = w.len - done;
        let n = pkt.payload.len() as u32;
        let len_ok = if pos.ends() {
            n == remaining
        } else {
            n == pmtu && remaining > pmtu
        };
        if !len_ok {
            self.fail_front(WcStatus::BadRespErr);
            return ReadOutcome::Failed;
        }
        if n > 0 && sg_write(mem, pd, &w.wr.sg_list, u64::from(done), pkt.payload).is_err() {
            self.fail_front(WcStatus::LocProtErr);
            return ReadOutcome::Failed;
        }
        let w = &mut self.sq[0];
        w.read_done += n;
        w.read_restart = false;
        self.comp.psn = psn.next();
        if pos.ends() {
            self.complete_front(WcStatus::Success);
        }
        ReadOutcome::Progress
    }

    /// Pop the head WQE with `status` (a completion if signaled or failed).
    fn complete_front(&mut self, status: WcStatus) {
        let Some(w) = self.sq.pop_front() else {
            return;
        };
        let next = w.last_psn.next();
        if next.is_after(self.comp.psn) {
            self.comp.psn = next;
        }
        if w.wr.signaled || status != WcStatus::Success {
            self.push_send_completion(&w, status);
        }
        if self.req.wqe_idx > 0 {
            self.req.wqe_idx -= 1;
        } else {
            // The requester was re-sending this WQE: move on to the next.
            self.req.offset = 0;
            self.req.psn = self.comp.psn;
        }
    }

    /// Forward progress: reset retry counters, re-arm or stop the
    /// retransmit timer, and skip the requester past acknowledged PSNs.
    fn after_progress(&mut self, now: Instant) {
        self.reset_retry_counters();
        if self.req.psn.is_before(self.comp.psn) {
            self.rewind();
        }
        self.req.retrans_at = if self.req.rnr_until.is_some() || !self.outstanding() {
            None
        } else {
            self.attr.ack_timeout().map(|d| now + d)
        };
    }

    /// Retry after a timeout, a sequence NAK or a skipped READ/atomic
    /// (rxe `COMPST_ERROR_RETRY`): consumes `retry_cnt` (7 = infinite).
    /// Only a timeout starts a retry while one is under way.
    pub(super) fn error_retry(&mut self, timeout: bool) {
        if self.comp.started_retry && !timeout {
            return;
        }
        self.comp.started_retry = true;
        if self.comp.retry_left == 0 {
            self.fail_front(WcStatus::RetryExcErr);
            return;
        }
        if self.comp.retry_left != 7 {
            self.comp.retry_left -= 1;
        }
        self.req.need_retry = true;
    }

    /// RNR NAK: consume `rnr_retry` (7 = infinite) and wait out the timer.
    fn rnr_retry(&mut self, now: Instant, timer: u8) {
        if self.comp.rnr_left == 0 {
            self.fail_front(WcStatus::RnrRetryExcErr);
            return;
        }
        if self.comp.rnr_left != 7 {
            self.comp.rnr_left -= 1;
        }
        let wait = Duration::from_micros(u64::from(rnr_timer_usec(timer)));
        self.req.rnr_until = Some(now + wait);
        self.req.retrans_at = None;
        self.req.need_retry = false;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadOutcome {
    Progress,
    Ignored(&'static str),
    Failed,
}
