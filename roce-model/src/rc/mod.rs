//! Sans-IO RC queue-pair engine: requester, completer and responder
//! (the module split of Linux rxe's `rxe_req.c`, `rxe_comp.c`, `rxe_resp.c`),
//! driven like quinn-proto / smoltcp:
//!
//! * [`QueuePair::post_send`] / [`QueuePair::post_recv`] queue work;
//! * [`QueuePair::handle_packet`] feeds one received BTH..ICRC packet;
//! * [`QueuePair::poll_transmit`] yields the next BTH..ICRC packet to send
//!   (the ICRC field is left zero: the caller owns the IP/UDP headers and
//!   seals it with [`crate::IcrcScope::seal`]);
//! * [`QueuePair::poll_timeout`] / [`QueuePair::handle_timeout`] drive the
//!   retransmit and RNR timers;
//! * [`QueuePair::poll_completion`] yields completion queue entries.
//!
//! Time is an [`Instant`] passed in; nothing here reads a clock, sleeps or
//! does I/O. Memory is a [`MemoryStore`] the caller lends to the calls that touch
//! it ([`crate::Memory`] for owned buffers, a device's translation for guest
//! memory).

mod completer;
mod requester;
mod responder;
mod srq;
pub mod wr;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::headers::{Bth, Header};
use crate::icrc::ICRC_LEN;
use crate::mr::{Access, MemError, MemoryStore, ProtectionDomain};
use crate::opcode::Transport;
use crate::packet::{ExtHeaders, RocePacket};
use crate::psn::Psn;

pub use srq::SharedReceiveQueue;
pub use wr::{Completion, QpError, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus};

/// The requester stops when this many PSNs are unacknowledged (rxe `RXE_MAX_UNACKED_PSNS`).
pub const MAX_UNACKED_PSNS: i32 = 128;
/// AckReq is forced after this many packets without one (rxe `RXE_MAX_PKT_PER_ACK`).
pub const MAX_PKT_PER_ACK: u32 = 64;
/// Largest message (and RETH DMA length) accepted: 2³¹ bytes.
pub const MAX_MSG_LEN: u64 = 1 << 31;
/// ACK credit code sent in every AETH (rxe: "unlimited / invalid").
pub const CREDITS_INVALID: u8 = 0x1f;

/// Queue-pair states (SQD/SQE are not modelled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Just created or reset: nothing works.
    Reset,
    /// Receive WRs may be posted; no traffic.
    Init,
    /// Ready to receive: the responder runs.
    Rtr,
    /// Ready to send: requester and completer run too.
    Rts,
    /// Error: everything is flushed with `WR_FLUSH_ERR`.
    Error,
}

/// Path MTU (IB MTU enum).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        128 << (self as u8)
    }
    /// From the IB enum code 1..=5.
    pub const fn from_code(code: u8) -> Option<Mtu> {
        Some(match code {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }
    /// The largest IB MTU not above `netdev_mtu - 80` (rxe's rule).
    pub const fn for_netdev_mtu(netdev_mtu: u32) -> Option<Mtu> {
        let avail = netdev_mtu.saturating_sub(80);
        let mut code = 5u8;
        while code >= 1 {
            if (128u32 << code) <= avail {
                return Mtu::from_code(code);
            }
            code -= 1;
        }
        None
    }
}

/// Connection attributes (the `ib_qp_attr` subset RC needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// Path MTU.
    pub pmtu: Mtu,
    /// First PSN the requester sends (applied at RTR→RTS).
    pub sq_psn: u32,
    /// First PSN the responder expects (applied at INIT→RTR).
    pub rq_psn: u32,
    /// The peer's QP number.
    pub dest_qpn: u32,
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout; 0 = no timer.
    pub timeout: u8,
    /// Transport retries (0..=7; 7 = infinite, as rxe).
    pub retry_cnt: u8,
    /// RNR retries (0..=7; 7 = infinite).
    pub rnr_retry: u8,
    /// RNR timer code this responder puts in its RNR NAKs (0..=31).
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomic requests this requester may have.
    pub max_rd_atomic: u8,
    /// READ/atomic responder resources (replay ring size).
    pub max_dest_rd_atomic: u8,
    /// Remote operations this QP accepts (REMOTE_WRITE / READ / ATOMIC).
    pub access: Access,
}

impl Default for QpAttr {
    fn default() -> QpAttr {
        QpAttr {
            pmtu: Mtu::Mtu1024,
            sq_psn: 0,
            rq_psn: 0,
            dest_qpn: 0,
            timeout: 14,
            retry_cnt: 6,
            rnr_retry: 6,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        }
    }
}

impl QpAttr {
    fn validate(&self) -> Result<(), QpError> {
        if self.timeout > 31 {
            return Err(QpError::InvalidAttr("timeout > 31"));
        }
        if self.retry_cnt > 7 {
            return Err(QpError::InvalidAttr("retry_cnt > 7"));
        }
        if self.rnr_retry > 7 {
            return Err(QpError::InvalidAttr("rnr_retry > 7"));
        }
        if self.min_rnr_timer > 31 {
            return Err(QpError::InvalidAttr("min_rnr_timer > 31"));
        }
        if self.dest_qpn > 0xff_ffff {
            return Err(QpError::InvalidAttr("dest_qpn > 24 bits"));
        }
        Ok(())
    }

    /// The local ACK timeout, `None` when `timeout == 0` (infinite).
    pub fn ack_timeout(&self) -> Option<Duration> {
        (self.timeout != 0).then(|| Duration::from_nanos(4096u64 << self.timeout))
    }
}

/// Queue sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send WRs outstanding (posted and not yet completed, plus unpolled send completions).
    pub max_send_wr: usize,
    /// Receive WRs outstanding (likewise).
    pub max_recv_wr: usize,
    /// SGEs per WR.
    pub max_sge: usize,
    /// Largest inline payload of a send WR, in bytes.
    pub max_inline_data: usize,
}

impl Default for QpCaps {
    fn default() -> QpCaps {
        QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_sge: 8,
            max_inline_data: 256,
        }
    }
}

/// Counters, mostly for tests and debugging.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpStats {
    /// Packets returned by `poll_transmit`.
    pub tx_packets: u64,
    /// Packets accepted by `handle_packet` (before any protocol check).
    pub rx_packets: u64,
    /// Go-back-N rewinds performed by the requester.
    pub retries: u64,
    /// Retransmit-timer expiries with work outstanding.
    pub timeouts: u64,
    /// RNR NAKs received.
    pub rnr_naks_received: u64,
    /// PSN-sequence-error NAKs received.
    pub seq_naks_received: u64,
    /// PSN-sequence-error NAKs sent.
    pub seq_naks_sent: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// Out-of-sequence requests dropped silently (after the one NAK).
    pub out_of_seq_dropped: u64,
    /// Duplicate requests received.
    pub duplicates: u64,
    /// READ replays started for duplicate READ requests.
    pub read_replays: u64,
    /// Atomic replies replayed from the saved value.
    pub atomic_replays: u64,
    /// Atomics executed on memory.
    pub atomics_executed: u64,
    /// Messages completed by the responder (the MSN count).
    pub messages_received: u64,
    /// Stale or unexpected responses ignored by the completer.
    pub responses_ignored: u64,
}

/// Which queue a completion's slot belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Send,
    Recv,
    Srq,
}

/// A send WQE and its progress.
#[derive(Debug)]
struct SendWqe {
    wr: SendWr,
    /// Message length (8 for atomics).
    len: u32,
    first_psn: Psn,
    last_psn: Psn,
    /// PSNs assigned (transmission started at least once).
    assigned: bool,
    /// Every packet sent at least once.
    sent: bool,
    /// READ: bytes placed so far (always a multiple of the PMTU until done).
    read_done: u32,
    /// READ: the next response must start a message (FIRST / ONLY).
    read_restart: bool,
    /// Error status to report when flushed.
    status: Option<WcStatus>,
}

impl SendWqe {
    fn npkts(&self, pmtu: u32) -> u32 {
        if self.wr.op.is_atomic() {
            1
        } else {
            Psn::packets_for(u64::from(self.len), pmtu)
        }
    }
}

/// Requester position and timers.
#[derive(Debug)]
struct ReqState {
    /// Next PSN to send.
    psn: Psn,
    /// Index in `sq` of the WQE being (re)sent.
    wqe_idx: usize,
    /// Byte offset inside that WQE.
    offset: u32,
    noack_pkts: u32,
    need_retry: bool,
    rnr_until: Option<Instant>,
    retrans_at: Option<Instant>,
}

/// Completer state.
#[derive(Debug)]
struct CompState {
    /// Oldest PSN not yet acknowledged.
    psn: Psn,
    retry_left: u8,
    rnr_left: u8,
    /// A retry is under way: later out-of-sequence responses and sequence
    /// NAKs (the tail of what was in flight) start no new one until
    /// progress or a timeout (rxe `comp.started_retry`). Without this, a
    /// lost READ response followed by the responses of later READs rewinds
    /// the send queue once per packet and the replays never end.
    started_retry: bool,
}

/// A receive WQE taken by the responder.
#[derive(Debug)]
struct TakenRecv {
    wr: RecvWr,
    slot: Slot,
    offset: u32,
}

/// Multi-packet message in progress at the responder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InMsg {
    None,
    Send,
    Write {
        va: u64,
        rkey: u32,
        resid: u32,
        total: u32,
    },
}

/// Saved READ / atomic state for duplicate replay (responder resources).
#[derive(Debug, Clone, Copy)]
enum RespRes {
    Read {
        first_psn: Psn,
        last_psn: Psn,
        va: u64,
        rkey: u32,
        len: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
}

/// A READ response stream being emitted.
#[derive(Debug, Clone, Copy)]
struct ReadReply {
    /// Resource (first PSN of the original request) this replies for.
    res_psn: Psn,
    psn: Psn,
    va: u64,
    rkey: u32,
    remaining: u32,
    started: bool,
    msn: u32,
}

/// Responder output, in PSN order.
#[derive(Debug, Clone, Copy)]
enum RespOut {
    Ack {
        psn: Psn,
        syndrome: crate::headers::AethSyndrome,
        msn: u32,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
    Read(ReadReply),
}

/// Responder state.
#[derive(Debug)]
struct RespState {
    /// Expected PSN.
    psn: Psn,
    msn: u32,
    sent_psn_nak: bool,
    in_msg: InMsg,
    recv: Option<TakenRecv>,
    resources: VecDeque<RespRes>,
    out: VecDeque<RespOut>,
}

/// An RC queue pair.
#[derive(Debug)]
pub struct QueuePair {
    qpn: u32,
    pd: ProtectionDomain,
    state: QpState,
    attr: QpAttr,
    caps: QpCaps,
    srq: Option<SharedReceiveQueue>,
    sq: VecDeque<SendWqe>,
    req: ReqState,
    comp: CompState,
    rq: VecDeque<RecvWr>,
    resp: RespState,
    cq: VecDeque<(Completion, Slot)>,
    send_cqes: usize,
    recv_cqes: usize,
    stats: QpStats,
}

impl QueuePair {
    /// A QP in RESET with its own receive queue.
    pub fn new(qpn: u32, pd: ProtectionDomain, caps: QpCaps) -> QueuePair {
        QueuePair {
            qpn: qpn & 0xff_ffff,
            pd,
            state: QpState::Reset,
            attr: QpAttr::default(),
            caps,
            srq: None,
            sq: VecDeque::new(),
            req: ReqState {
                psn: Psn::new(0),
                wqe_idx: 0,
                offset: 0,
                noack_pkts: 0,
                need_retry: false,
                rnr_until: None,
                retrans_at: None,
            },
            comp: CompState {
                psn: Psn::new(0),
                retry_left: 0,
                rnr_left: 0,
                started_retry: false,
            },
            rq: VecDeque::new(),
            resp: RespState {
                psn: Psn::new(0),
                msn: 0,
                sent_psn_nak: false,
                in_msg: InMsg::None,
                recv: None,
                resources: VecDeque::new(),
                out: VecDeque::new(),
            },
            cq: VecDeque::new(),
            send_cqes: 0,
            recv_cqes: 0,
            stats: QpStats::default(),
        }
    }

    /// A QP in RESET that takes receive WQEs from `srq`.
    pub fn with_srq(
        qpn: u32,
        pd: ProtectionDomain,
        caps: QpCaps,
        srq: SharedReceiveQueue,
    ) -> QueuePair {
        let mut qp = QueuePair::new(qpn, pd, caps);
        qp.srq = Some(srq);
        qp
    }

    /// Local QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }
    /// Protection domain.
    pub fn pd(&self) -> ProtectionDomain {
        self.pd
    }
    /// Current state.
    pub fn state(&self) -> QpState {
        self.state
    }
    /// Current attributes.
    pub fn attr(&self) -> &QpAttr {
        &self.attr
    }
    /// Counters.
    pub fn stats(&self) -> &QpStats {
        &self.stats
    }
    /// Send WQEs not yet completed.
    pub fn send_queue_len(&self) -> usize {
        self.sq.len()
    }
    /// Receive WQEs posted and not yet consumed.
    pub fn recv_queue_len(&self) -> usize {
        self.rq.len()
    }
    /// The responder's current MSN.
    pub fn msn(&self) -> u32 {
        self.resp.msn
    }
    /// Next PSN the requester will use for new work.
    pub fn next_send_psn(&self) -> Psn {
        self.req.psn
    }
    /// Next PSN the responder expects.
    pub fn expected_psn(&self) -> Psn {
        self.resp.psn
    }

    /// Modify the QP state. Legal: RESET→INIT, INIT→RTR (applies the
    /// receive-side attributes), RTR→RTS (applies the send-side attributes),
    /// any→ERROR (flushes), any→RESET (drops everything).
    pub fn modify(&mut self, to: QpState, attr: &QpAttr) -> Result<(), QpError> {
        use QpState::*;
        let from = self.state;
        match (from, to) {
            (_, Reset) => {
                let (qpn, pd, caps, srq) = (self.qpn, self.pd, self.caps, self.srq.take());
                *self = QueuePair::new(qpn, pd, caps);
                self.srq = srq;
            }
            (_, Error) => self.enter_error(),
            (Reset, Init) => self.state = Init,
            (Init, Rtr) => {
                attr.validate()?;
                self.attr.pmtu = attr.pmtu;
                self.attr.rq_psn = attr.rq_psn;
                self.attr.dest_qpn = attr.dest_qpn;
                self.attr.min_rnr_timer = attr.min_rnr_timer;
                self.attr.max_dest_rd_atomic = attr.max_dest_rd_atomic;
                self.attr.access = attr.access;
                self.resp.psn = Psn::new(attr.rq_psn);
                self.state = Rtr;
            }
            (Rtr, Rts) => {
                attr.validate()?;
                self.attr.sq_psn = attr.sq_psn;
                self.attr.timeout = attr.timeout;
                self.attr.retry_cnt = attr.retry_cnt;
                self.attr.rnr_retry = attr.rnr_retry;
                self.attr.max_rd_atomic = attr.max_rd_atomic;
                self.req.psn = Psn::new(attr.sq_psn);
                self.comp.psn = Psn::new(attr.sq_psn);
                self.reset_retry_counters();
                self.state = Rts;
            }
            _ => return Err(QpError::BadTransition { from, to }),
        }
        Ok(())
    }

    /// RESET → INIT → RTR → RTS with `attr`.
    pub fn connect(&mut self, attr: &QpAttr) -> Result<(), QpError> {
        self.modify(QpState::Init, attr)?;
        self.modify(QpState::Rtr, attr)?;
        self.modify(QpState::Rts, attr)
    }

    /// Post a send work request (state RTS; in ERROR it completes at once
    /// with `WR_FLUSH_ERR`).
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), QpError> {
        match self.state {
            QpState::Rts | QpState::Error => {}
            s => return Err(QpError::BadState(s)),
        }
        if self.sq.len() + self.send_cqes >= self.caps.max_send_wr {
            return Err(QpError::SendQueueFull(self.caps.max_send_wr));
        }
        if wr.sg_list.len() > self.caps.max_sge {
            return Err(QpError::InvalidWr("too many SGEs"));
        }
        let sg_len = if wr.inline_data.is_empty() {
            sg_len(&wr.sg_list)
        } else {
            let inline_ok = matches!(
                wr.op,
                SendOp::Send
                    | SendOp::SendWithImm { .. }
                    | SendOp::SendWithInv { .. }
                    | SendOp::RdmaWrite { .. }
                    | SendOp::RdmaWriteWithImm { .. }
            );
            if !inline_ok || !wr.sg_list.is_empty() {
                return Err(QpError::InvalidWr(
                    "inline data on a READ/atomic or with SGEs",
                ));
            }
            if wr.inline_data.len() > self.caps.max_inline_data {
                return Err(QpError::InvalidWr(
                    "inline data longer than max_inline_data",
                ));
            }
            wr.inline_data.len() as u64
        };
        if sg_len > MAX_MSG_LEN {
            return Err(QpError::InvalidWr("message longer than 2^31"));
        }
        let len = if wr.op.is_atomic() {
            if sg_len < 8 {
                return Err(QpError::InvalidWr("atomic needs an 8-byte result buffer"));
            }
            8
        } else {
            sg_len as u32
        };
        if wr.op.is_read_or_atomic() && self.attr.max_rd_atomic == 0 {
            return Err(QpError::InvalidWr("max_rd_atomic is 0"));
        }
        let wqe = SendWqe {
            wr,
            len,
            first_psn: Psn::new(0),
            last_psn: Psn::new(0),
            assigned: false,
            sent: false,
            read_done: 0,
            read_restart: false,
            status: None,
        };
        if self.state == QpState::Error {
            self.push_send_completion(&wqe, WcStatus::WrFlushErr);
        } else {
            self.sq.push_back(wqe);
        }
        Ok(())
    }

    /// Post a receive work request (any state but RESET; in ERROR it
    /// completes at once with `WR_FLUSH_ERR`).
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), QpError> {
        if self.srq.is_some() {
            return Err(QpError::HasSrq);
        }
        if self.state == QpState::Reset {
            return Err(QpError::BadState(self.state));
        }
        let held = usize::from(matches!(&self.resp.recv, Some(r) if r.slot == Slot::Recv));
        if self.rq.len() + held + self.recv_cqes >= self.caps.max_recv_wr {
            return Err(QpError::RecvQueueFull(self.caps.max_recv_wr));
        }
        if wr.sg_list.len() > self.caps.max_sge {
            return Err(QpError::InvalidWr("too many SGEs"));
        }
        if self.state == QpState::Error {
            self.push_recv_completion(&wr, Slot::Recv, WcStatus::WrFlushErr, 0, None, None);
        } else {
            self.rq.push_back(wr);
        }
        Ok(())
    }

    /// Feed one received packet (BTH..ICRC; the ICRC is not checked here).
    pub fn handle_bytes(
        &mut self,
        bytes: &[u8],
        now: Instant,
        mem: &mut dyn MemoryStore,
    ) -> Result<(), QpError> {
        let pkt = RocePacket::parse(bytes)?;
        self.handle_packet(&pkt, now, mem)
    }

    /// Feed one parsed packet addressed to this QP.
    pub fn handle_packet(
        &mut self,
        pkt: &RocePacket<'_>,
        now: Instant,
        mem: &mut dyn MemoryStore,
    ) -> Result<(), QpError> {
        if pkt.bth.dest_qp != self.qpn {
            return Err(QpError::Dropped("destination QP mismatch"));
        }
        if pkt.bth.opcode.transport() != Transport::Rc {
            return Err(QpError::Dropped("not an RC packet"));
        }
        self.stats.rx_packets += 1;
        let info = pkt.info();
        if info.is_request() {
            self.handle_request(pkt, now, mem)
        } else if info.is_response() {
            self.handle_response(pkt, now, mem)
        } else {
            Err(QpError::Dropped("neither request nor response"))
        }
    }

    /// The next packet to send, BTH..ICRC with a zero ICRC placeholder.
    /// Responses (ACKs, NAKs, READ responses) go first.
    pub fn poll_transmit(&mut self, now: Instant, mem: &dyn MemoryStore) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        self.poll_transmit_into(now, mem, &mut out, 0)
            .then_some(out)
    }

    /// Like [`QueuePair::poll_transmit`], but writes the packet into the
    /// caller's buffer after `headroom` bytes it leaves for the outer
    /// headers (Ethernet, IP, UDP), so that payload moves from the memory
    /// store into the frame once. `out` is cleared first; returns whether a
    /// packet was written (`out[headroom..]` is then BTH..ICRC).
    pub fn poll_transmit_into(
        &mut self,
        now: Instant,
        mem: &dyn MemoryStore,
        out: &mut Vec<u8>,
        headroom: usize,
    ) -> bool {
        let sent = match self.state {
            QpState::Reset | QpState::Init => false,
            QpState::Rtr | QpState::Error => self.next_response(mem, out, headroom),
            QpState::Rts => {
                self.next_response(mem, out, headroom) || self.next_request(now, mem, out, headroom)
            }
        };
        if sent {
            self.stats.tx_packets += 1;
        }
        sent
    }

    /// When [`QueuePair::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.state != QpState::Rts {
            return None;
        }
        match (self.req.rnr_until, self.req.retrans_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Run the timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.state != QpState::Rts {
            return;
        }
        if self.req.rnr_until.is_some_and(|t| t <= now) {
            self.req.rnr_until = None;
            self.req.need_retry = true;
        }
        if self.req.retrans_at.is_some_and(|t| t <= now) {
            self.req.retrans_at = None;
            if self.outstanding() {
                self.stats.timeouts += 1;
                self.error_retry(true);
            }
        }
    }

    /// The next completion queue entry.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        let (c, slot) = self.cq.pop_front()?;
        match slot {
            Slot::Send => self.send_cqes -= 1,
            Slot::Recv => self.recv_cqes -= 1,
            Slot::Srq => {}
        }
        Some(c)
    }

    /// Is there nothing left to send and nothing awaiting acknowledgement?
    pub fn is_idle(&self) -> bool {
        self.resp.out.is_empty() && self.sq.is_empty()
    }

    // ----- shared internals -----

    fn pmtu(&self) -> u32 {
        self.attr.pmtu.bytes()
    }

    /// Anything sent and not yet acknowledged? (Assigned WQEs form a prefix of `sq`.)
    fn outstanding(&self) -> bool {
        self.req.psn != self.comp.psn || self.sq.front().is_some_and(|w| w.assigned)
    }

    fn reset_retry_counters(&mut self) {
        self.comp.retry_left = self.attr.retry_cnt;
        self.comp.rnr_left = self.attr.rnr_retry;
        self.comp.started_retry = false;
    }

    fn push_send_completion(&mut self, wqe: &SendWqe, status: WcStatus) {
        self.send_cqes += 1;
        self.cq.push_back((
            Completion {
                wr_id: wqe.wr.wr_id,
                status,
                opcode: wqe.wr.op.wc_opcode(),
                byte_len: wqe.len,
                imm: None,
                invalidated_rkey: None,
                qp_num: self.qpn,
            },
            Slot::Send,
        ));
    }

    /// Completes, successfully, the posted receive a message consumed, as
    /// `op`: `len` bytes (`None`: the bytes placed in it). False when no
    /// receive was taken.
    fn complete_recv(
        &mut self,
        len: Option<u32>,
        imm: Option<u32>,
        op: (WcOpcode, Option<u32>),
    ) -> bool {
        let Some(r) = self.resp.recv.take() else {
            return false;
        };
        let len = len.unwrap_or(r.offset);
        self.push_recv_completion(&r.wr, r.slot, WcStatus::Success, len, imm, Some(op));
        true
    }

    fn push_recv_completion(
        &mut self,
        wr: &RecvWr,
        slot: Slot,
        status: WcStatus,
        byte_len: u32,
        imm: Option<u32>,
        opcode_inv: Option<(WcOpcode, Option<u32>)>,
    ) {
        if slot == Slot::Recv {
            self.recv_cqes += 1;
        }
        let (opcode, invalidated_rkey) = opcode_inv.unwrap_or((WcOpcode::Recv, None));
        self.cq.push_back((
            Completion {
                wr_id: wr.wr_id,
                status,
                opcode,
                byte_len,
                imm,
                invalidated_rkey,
                qp_num: self.qpn,
            },
            slot,
        ));
    }

    /// Move to ERROR: complete every send WQE (its recorded error or
    /// `WR_FLUSH_ERR`) and every receive WQE with `WR_FLUSH_ERR`, drop all
    /// pending output and timers.
    fn enter_error(&mut self) {
        if self.state == QpState::Error {
            return;
        }
        self.state = QpState::Error;
        while let Some(wqe) = self.sq.pop_front() {
            let status = wqe.status.unwrap_or(WcStatus::WrFlushErr);
            self.push_send_completion(&wqe, status);
        }
        if let Some(r) = self.resp.recv.take() {
            self.push_recv_completion(&r.wr, r.slot, WcStatus::WrFlushErr, 0, None, None);
        }
        while let Some(wr) = self.rq.pop_front() {
            self.push_recv_completion(&wr, Slot::Recv, WcStatus::WrFlushErr, 0, None, None);
        }
        self.resp.out.clear();
        self.resp.in_msg = InMsg::None;
        self.req.rnr_until = None;
        self.req.retrans_at = None;
        self.req.need_retry = false;
        self.req.wqe_idx = 0;
        self.req.offset = 0;
    }

    /// Fail the oldest send WQE with `status` and move to ERROR.
    fn fail_front(&mut self, status: WcStatus) {
        if let Some(w) = self.sq.front_mut() {
            w.status = Some(status);
        }
        self.enter_error();
    }
}

/// Total length of an SGE list.
fn sg_len(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}

/// Walk `sges` from logical byte `offset`, calling `f(sge, offset_in_sge,
/// chunk_len, offset_in_buf)` for each piece of a `len`-byte range.
fn sg_walk(
    sges: &[Sge],
    offset: u64,
    len: usize,
    mut f: impl FnMut(&Sge, u64, usize, usize) -> Result<(), MemError>,
) -> Result<(), MemError> {
    let mut skip = offset;
    let mut done = 0usize;
    for sge in sges {
        if done == len {
            break;
        }
        let sl = u64::from(sge.length);
        if skip >= sl {
            skip -= sl;
            continue;
        }
        let chunk = usize::try_from((sl - skip).min((len - done) as u64)).unwrap_or(usize::MAX);
        f(sge, skip, chunk, done)?;
        done += chunk;
        skip = 0;
    }
    if done == len {
        Ok(())
    } else {
        Err(MemError::OutOfBounds {
            key: sges.first().map_or(0, |s| s.lkey),
            iova: offset,
            len: len as u64,
        })
    }
}

/// Gather `dst.len()` bytes from `sges` at logical `offset`.
fn sg_read(
    mem: &dyn MemoryStore,
    pd: ProtectionDomain,
    sges: &[Sge],
    offset: u64,
    dst: &mut [u8],
) -> Result<(), MemError> {
    let len = dst.len();
    sg_walk(sges, offset, len, |sge, at, n, pos| {
        let iova = sge.addr.checked_add(at).ok_or(MemError::OutOfBounds {
            key: sge.lkey,
            iova: sge.addr,
            len: at,
        })?;
        let span = mem.check_local(pd, sge.lkey, iova, n as u64, Access::NONE)?;
        mem.read_span(&span, 0, &mut dst[pos..pos + n])
    })
}

/// Scatter `src` into `sges` at logical `offset` (needs LOCAL_WRITE).
fn sg_write(
    mem: &mut dyn MemoryStore,
    pd: ProtectionDomain,
    sges: &[Sge],
    offset: u64,
    src: &[u8],
) -> Result<(), MemError> {
    sg_walk(sges, offset, src.len(), |sge, at, n, pos| {
        let iova = sge.addr.checked_add(at).ok_or(MemError::OutOfBounds {
            key: sge.lkey,
            iova: sge.addr,
            len: at,
        })?;
        let span = mem.check_local(pd, sge.lkey, iova, n as u64, Access::LOCAL_WRITE)?;
        mem.write_span(&span, 0, &src[pos..pos + n])
    })
}

/// Write BTH + `ext` + a `payload_len`-byte payload filled by `fill`, the
/// pad, and a zero ICRC into `out` after `headroom` bytes left for the
/// caller's outer headers (`out` is cleared first).
fn emit(
    mut bth: Bth,
    ext: &ExtHeaders,
    payload_len: usize,
    out: &mut Vec<u8>,
    headroom: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<(), MemError>,
) -> Result<(), MemError> {
    let pad = payload_len.wrapping_neg() & 3;
    bth.pad_cnt = pad as u8;
    let hdr = Bth::LEN + bth.opcode.info().ext_len();
    out.clear();
    out.resize(headroom + hdr + payload_len + pad + ICRC_LEN, 0);
    let pkt = &mut out[headroom..];
    bth.write(pkt)
        .map_err(|_| MemError::Backing("BTH encode"))?;
    ext.write(&mut pkt[Bth::LEN..])
        .map_err(|_| MemError::Backing("ext header encode"))?;
    fill(&mut pkt[hdr..hdr + payload_len])
}
