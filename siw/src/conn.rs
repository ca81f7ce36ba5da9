//! The sans-IO iWARP connection engine: MPA connection setup, an RC queue
//! pair (SQ, RQ, ORQ, IRQ) over DDP/RDMAP, memory regions, completions and
//! Terminate handling.
//!
//! Feed stream bytes with [`Connection::handle_bytes`], drain bytes for the
//! TCP stream with [`Connection::poll_transmit`] (or
//! [`Connection::poll_transmit_into`]), collect [`Event`]s with
//! [`Connection::poll_event`]. The only clock is the connection-setup
//! deadline ([`Connection::poll_timeout`] / [`Connection::handle_timeout`]).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::ddp::{
    ddp_ecode, llp_ecode, qn, rdmap_ecode, rdmap_etype, DdpHdr, Header, Opcode, ReadRequest,
    TermError, Terminate, READ_REQ_LEN, TAGGED_HDR_LEN, UNTAGGED_HDR_LEN,
};
use crate::mem::{Access, AccessError, MemTable};
use crate::mpa::{
    self, Deframer, FrameError, FrameKind, MpaConfig, MpaError, MpaFrame, Negotiated,
    NegotiationError, Rtr,
};

/// Engine configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// MPA policy (CRC, revision, IRD/ORD, peer-to-peer).
    pub mpa: MpaConfig,
    /// Largest FPDU we transmit, MPA length and CRC included. siw keeps an
    /// FPDU within one TCP MSS (default 1460 here); larger values cut the
    /// per-FPDU cost on loopback. At most 65535 + 6.
    pub max_fpdu_len: usize,
    /// Largest ULPDU accepted from the peer (at most 65535).
    pub max_rx_ulpdu: usize,
    /// Send queue depth.
    pub sq_depth: usize,
    /// Receive queue depth.
    pub rq_depth: usize,
    /// Bytes produced per [`Connection::poll_transmit`] call (soft limit).
    pub tx_batch: usize,
    /// Deadline for the MPA exchange; `None` waits forever.
    pub setup_timeout: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            mpa: MpaConfig::default(),
            max_fpdu_len: 1460,
            max_rx_ulpdu: u16::MAX as usize,
            sq_depth: 1024,
            rq_depth: 1024,
            tx_batch: 256 * 1024,
            setup_timeout: Some(Duration::from_secs(10)),
        }
    }
}

/// Which side of the MPA exchange this connection plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Active side: sends the MPA Request.
    Initiator,
    /// Passive side: answers with the MPA Reply.
    Responder,
}

/// Local scatter/gather element: `len` bytes at address `addr` of the
/// region `stag`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// STag of a locally registered region.
    pub stag: u32,
    /// Address within the region (`va`-based).
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
}

/// Send queue work requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkRequest {
    /// Send (with optional Solicited Event and remote Invalidate).
    Send {
        /// Source buffer (may be zero-length).
        local: Sge,
        /// Solicited Event.
        solicited: bool,
        /// STag for the peer to invalidate.
        invalidate: Option<u32>,
    },
    /// RDMA Write of `local` to the peer's `remote_stag` at `remote_addr`.
    Write {
        /// Source buffer.
        local: Sge,
        /// Peer STag.
        remote_stag: u32,
        /// Peer tagged offset.
        remote_addr: u64,
    },
    /// RDMA Read of `local.len` bytes from the peer into `local`.
    Read {
        /// Sink buffer (needs [`Access::LOCAL_WRITE`]).
        local: Sge,
        /// Peer STag.
        remote_stag: u32,
        /// Peer tagged offset.
        remote_addr: u64,
    },
}

/// Kind of a completed work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    /// A Send left.
    Send,
    /// An RDMA Write left.
    Write,
    /// An RDMA Read completed.
    Read,
    /// A receive was filled.
    Recv,
}

/// Completion status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcStatus {
    /// Success.
    Success,
    /// Local length error (message longer than the receive buffer).
    LocalLength,
    /// Local protection error (local buffer invalid).
    LocalProtection,
    /// The connection failed; this request was not (fully) executed.
    Flushed,
    /// The request ran into a fatal error.
    Fatal,
}

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The caller's id.
    pub wr_id: u64,
    /// Kind.
    pub opcode: WcOpcode,
    /// Status.
    pub status: WcStatus,
    /// Bytes transferred (receive: message length).
    pub byte_len: u32,
    /// Receive of a Send with Solicited Event.
    pub solicited: bool,
    /// Receive of a Send with Invalidate: the STag invalidated.
    pub invalidated: Option<u32>,
}

/// Why a connection failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConnError {
    /// Malformed MPA Request/Reply.
    #[error("MPA frame error: {0}")]
    Mpa(#[from] MpaError),
    /// MPA negotiation failed (includes a peer's reject).
    #[error("MPA negotiation failed: {0}")]
    Negotiation(#[from] NegotiationError),
    /// The MPA exchange did not finish in time.
    #[error("connection setup timed out")]
    Timeout,
    /// We detected a protocol error and sent a Terminate.
    #[error("local terminate: {0}")]
    LocalTerminate(TermError),
    /// The peer sent a Terminate.
    #[error("remote terminate: {}", .0.error)]
    RemoteTerminate(Terminate),
    /// The TCP stream ended or failed with work outstanding.
    #[error("TCP stream lost: {0}")]
    StreamLost(String),
    /// A local buffer became unusable during transmission.
    #[error("local protection error")]
    LocalProtection,
}

/// Engine events.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Responder: an acceptable MPA Request arrived; answer with
    /// [`Connection::accept`] or [`Connection::reject`].
    ConnectRequest {
        /// ULP private data of the Request.
        private_data: Vec<u8>,
        /// Parameters that [`Connection::accept`] will use.
        negotiated: Negotiated,
    },
    /// The connection is in RTS. `private_data` is the peer's.
    Connected {
        /// Peer's ULP private data.
        private_data: Vec<u8>,
        /// Negotiated parameters.
        negotiated: Negotiated,
    },
    /// Initiator: the responder rejected us.
    Rejected {
        /// Private data of the reject Reply.
        private_data: Vec<u8>,
    },
    /// A work request completed.
    Completion(Completion),
    /// The connection failed.
    Error(ConnError),
    /// The connection is over (always the last event).
    Closed,
}

/// Errors returned by the posting API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum PostError {
    /// Queue full.
    #[error("queue full")]
    QueueFull,
    /// Connection in error or closed.
    #[error("connection not usable")]
    InvalidState,
    /// Local buffer check failed.
    #[error("local buffer: {0:?}")]
    Local(AccessError),
    /// Not in the state the call needs.
    #[error("wrong connection state for this call")]
    WrongState,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    AwaitRequest,
    RequestReceived,
    AwaitReply,
    Rts,
    Error,
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SqOp {
    User(WorkRequest),
    Rtr(Rtr),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SqState {
    Queued,
    ReadInFlight,
    Done(WcStatus),
}

#[derive(Debug)]
struct SqEntry {
    wr_id: u64,
    op: SqOp,
    sent: u32,
    state: SqState,
    byte_len: u32,
}

#[derive(Debug)]
struct OrqEntry {
    seq: u64,
    sink_stag: u32,
    sink_addr: u64,
    len: u32,
    received: u32,
}

#[derive(Debug)]
struct IrqEntry {
    sink_stag: u32,
    sink_to: u64,
    src_stag: u32,
    src_addr: u64,
    len: u32,
    sent: u32,
}

#[derive(Debug)]
struct RecvWr {
    wr_id: u64,
    sge: Sge,
}

#[derive(Debug)]
struct RecvInProgress {
    wr: RecvWr,
    opcode: Opcode,
    received: u32,
    inval: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxSource {
    Sq,
    Irq,
}

/// One iWARP connection (MPA endpoint + queue pair).
#[derive(Debug)]
pub struct Connection {
    cfg: Config,
    role: Role,
    state: State,
    setup_rx: Vec<u8>,
    deadline: Option<Instant>,
    sent_req: Option<MpaFrame>,
    peer_req: Option<MpaFrame>,
    neg: Option<Negotiated>,
    deframer: Option<Deframer>,
    raw_tx: Vec<u8>,
    mem: MemTable,
    sq: VecDeque<SqEntry>,
    sq_base: u64,
    sq_next: usize,
    rq: VecDeque<RecvWr>,
    orq: VecDeque<OrqEntry>,
    irq: VecDeque<IrqEntry>,
    tx_msn: [u32; 3],
    rx_msn: [u32; 3],
    rx_send: Option<RecvInProgress>,
    rx_write: Option<(u32, u64)>,
    tx_gated: bool,
    tx_cur: Option<TxSource>,
    prefer_irq: bool,
    term_tx: Option<Terminate>,
    crc: bool,
    events: VecDeque<Event>,
    hdr_scratch: Vec<u8>,
    peer_ops: PeerOps,
}

/// Remote operations the peer ran on this side's memory: tagged messages
/// leave no completion here, so a responder that wants to count what the
/// peer did (a benchmark server) reads these.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerOps {
    /// RDMA Write messages fully placed (last segment arrived).
    pub writes: u64,
    /// Bytes placed by RDMA Writes.
    pub write_bytes: u64,
    /// RDMA Read Requests accepted (each is answered with a response).
    pub read_requests: u64,
    /// Bytes asked for by those Read Requests.
    pub read_bytes: u64,
}

impl Connection {
    fn new(role: Role, cfg: Config, now: Instant) -> Self {
        let deadline = cfg.setup_timeout.map(|d| now + d);
        Self {
            role,
            state: match role {
                Role::Initiator => State::AwaitReply,
                Role::Responder => State::AwaitRequest,
            },
            setup_rx: Vec::new(),
            deadline,
            sent_req: None,
            peer_req: None,
            neg: None,
            deframer: None,
            raw_tx: Vec::new(),
            mem: MemTable::default(),
            sq: VecDeque::new(),
            sq_base: 0,
            sq_next: 0,
            rq: VecDeque::new(),
            orq: VecDeque::new(),
            irq: VecDeque::new(),
            tx_msn: [1; 3],
            rx_msn: [1; 3],
            rx_send: None,
            rx_write: None,
            tx_gated: false,
            tx_cur: None,
            prefer_irq: false,
            term_tx: None,
            crc: false,
            events: VecDeque::new(),
            hdr_scratch: Vec::with_capacity(64),
            peer_ops: PeerOps::default(),
            cfg,
        }
    }

    /// Active side: queues the MPA Request carrying `private_data`
    /// (at most 512 bytes, 508 with revision 2).
    pub fn initiator(cfg: Config, private_data: &[u8], now: Instant) -> Result<Self, MpaError> {
        let mut c = Self::new(Role::Initiator, cfg, now);
        let req = mpa::initiator_request(&c.cfg.mpa, private_data);
        req.encode(&mut c.raw_tx)?;
        c.sent_req = Some(req);
        Ok(c)
    }

    /// Passive side, on a freshly accepted TCP stream.
    pub fn responder(cfg: Config, now: Instant) -> Self {
        Self::new(Role::Responder, cfg, now)
    }

    /// Role of this connection.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Negotiated parameters once connected.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.neg.as_ref()
    }

    /// In RTS (connected and not failed).
    pub fn is_connected(&self) -> bool {
        self.state == State::Rts
    }

    /// The connection has ended and has nothing left to transmit: the
    /// driver may close the socket.
    pub fn is_finished(&self) -> bool {
        matches!(self.state, State::Error | State::Closed)
            && self.raw_tx.is_empty()
            && self.term_tx.is_none()
    }

    /// Memory regions.
    pub fn mem(&self) -> &MemTable {
        &self.mem
    }

    /// What the peer's RDMA Writes and Read Requests did here so far.
    pub fn peer_ops(&self) -> PeerOps {
        self.peer_ops
    }

    /// Memory regions, mutable (register, invalidate, access buffers).
    pub fn mem_mut(&mut self) -> &mut MemTable {
        &mut self.mem
    }

    /// Registers a buffer at base address 0; returns its STag.
    pub fn register_mr(&mut self, data: Vec<u8>, access: Access) -> u32 {
        self.mem.register(data, 0, access)
    }

    /// Next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Setup deadline, while the MPA exchange is running.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::AwaitReply | State::AwaitRequest => self.deadline,
            _ => None,
        }
    }

    /// Fires the setup deadline if `now` has passed it.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(d) = self.poll_timeout() {
            if now >= d {
                self.fail(ConnError::Timeout, None);
            }
        }
    }

    // -----------------------------------------------------------------------
    // Connection management
    // -----------------------------------------------------------------------

    /// Responder: accepts the pending Request, sending a Reply with
    /// `private_data`.
    pub fn accept(&mut self, private_data: &[u8]) -> Result<(), PostError> {
        if self.state != State::RequestReceived {
            return Err(PostError::WrongState);
        }
        let n = self.neg.expect("negotiated");
        let rep = mpa::responder_reply(&self.cfg.mpa, &n, private_data);
        if rep.encode(&mut self.raw_tx).is_err() {
            return Err(PostError::Local(AccessError::BaseBounds));
        }
        let pd = self
            .peer_req
            .as_ref()
            .map(|r| r.private_data.clone())
            .unwrap_or_default();
        self.enter_rts(n);
        self.tx_gated = n.rtr.is_some();
        self.events.push_back(Event::Connected {
            private_data: pd,
            negotiated: n,
        });
        self.process_rx();
        Ok(())
    }

    /// Responder: rejects the pending Request with `private_data`.
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), PostError> {
        if self.state != State::RequestReceived {
            return Err(PostError::WrongState);
        }
        let rep = mpa::reject_reply(self.peer_req.as_ref(), private_data);
        rep.encode(&mut self.raw_tx)
            .map_err(|_| PostError::Local(AccessError::BaseBounds))?;
        self.state = State::Closed;
        self.flush();
        self.events.push_back(Event::Closed);
        Ok(())
    }

    /// Local graceful close: flushes outstanding work; the driver closes the
    /// socket once [`is_finished`](Self::is_finished).
    pub fn close(&mut self) {
        if matches!(self.state, State::Error | State::Closed) {
            return;
        }
        self.state = State::Closed;
        self.flush();
        self.events.push_back(Event::Closed);
    }

    /// The peer closed its side of the TCP stream. With work outstanding
    /// (or mid-FPDU, or during setup) this is a [`ConnError::StreamLost`];
    /// otherwise a clean disconnect ([`Event::Closed`] only).
    pub fn handle_eof(&mut self) {
        match self.state {
            State::Error | State::Closed => {}
            State::Rts => {
                let busy = self.sq.iter().any(|e| !matches!(e.state, SqState::Done(_)))
                    || self.deframer.as_ref().is_some_and(|d| d.buffered() > 0)
                    || self.rx_send.is_some()
                    || self.rx_write.is_some()
                    || !self.irq.is_empty();
                if busy {
                    self.fail(ConnError::StreamLost("peer closed the stream".into()), None);
                } else {
                    self.close();
                }
            }
            _ => self.fail(
                ConnError::StreamLost("peer closed during setup".into()),
                None,
            ),
        }
    }

    /// The transport failed (reset, I/O error).
    pub fn handle_transport_error(&mut self, what: &str) {
        if !matches!(self.state, State::Error | State::Closed) {
            self.fail(ConnError::StreamLost(what.to_string()), None);
        }
    }

    fn enter_rts(&mut self, n: Negotiated) {
        self.neg = Some(n);
        self.crc = n.crc;
        self.state = State::Rts;
        let mut d = Deframer::new(n.crc, self.cfg.max_rx_ulpdu);
        d.push(&self.setup_rx);
        self.setup_rx = Vec::new();
        self.deframer = Some(d);
    }

    // -----------------------------------------------------------------------
    // Posting
    // -----------------------------------------------------------------------

    /// Posts a receive buffer (allowed before the connection is up).
    pub fn post_recv(&mut self, wr_id: u64, sge: Sge) -> Result<(), PostError> {
        if matches!(self.state, State::Error | State::Closed) {
            return Err(PostError::InvalidState);
        }
        if self.rq.len() >= self.cfg.rq_depth {
            return Err(PostError::QueueFull);
        }
        if sge.len > 0 {
            self.mem
                .check_access(sge.stag, sge.addr, sge.len as usize, Access::LOCAL_WRITE)
                .map_err(PostError::Local)?;
        }
        self.rq.push_back(RecvWr { wr_id, sge });
        Ok(())
    }

    /// Posts a Send, Write or Read. Transmission starts once connected.
    pub fn post_send(&mut self, wr_id: u64, wr: WorkRequest) -> Result<(), PostError> {
        if matches!(self.state, State::Error | State::Closed) {
            return Err(PostError::InvalidState);
        }
        if self.sq.len() >= self.cfg.sq_depth {
            return Err(PostError::QueueFull);
        }
        let (local, need) = match wr {
            WorkRequest::Send { local, .. } | WorkRequest::Write { local, .. } => {
                (local, Access::NONE)
            }
            WorkRequest::Read { local, .. } => (local, Access::LOCAL_WRITE),
        };
        if local.len > 0 {
            self.mem
                .check_access(local.stag, local.addr, local.len as usize, need)
                .map_err(PostError::Local)?;
        }
        self.sq.push_back(SqEntry {
            wr_id,
            op: SqOp::User(wr),
            sent: 0,
            state: SqState::Queued,
            byte_len: local.len,
        });
        Ok(())
    }

    /// Outstanding send queue entries (not yet completed).
    pub fn sq_outstanding(&self) -> usize {
        self.sq.len()
    }

    // -----------------------------------------------------------------------
    // Input
    // -----------------------------------------------------------------------

    /// Feeds bytes received from the TCP stream (any segmentation).
    pub fn handle_bytes(&mut self, data: &[u8]) {
        match self.state {
            State::AwaitRequest | State::AwaitReply => {
                self.setup_rx.extend_from_slice(data);
                self.process_setup();
            }
            State::RequestReceived => self.setup_rx.extend_from_slice(data),
            State::Rts => {
                if let Some(d) = self.deframer.as_mut() {
                    d.push(data);
                }
                self.process_rx();
            }
            State::Error | State::Closed => {}
        }
    }

    fn process_setup(&mut self) {
        let (frame, used) = match MpaFrame::parse(&self.setup_rx) {
            Ok(None) => return,
            Ok(Some(x)) => x,
            Err(e) => {
                let term = (self.role == Role::Initiator)
                    .then(|| Terminate::new(TermError::llp(llp_ecode::INVALID_REQ_RESP)));
                self.fail(ConnError::Mpa(e), term);
                return;
            }
        };
        self.setup_rx.drain(..used);
        match self.role {
            Role::Responder => {
                if frame.kind != FrameKind::Request {
                    self.fail(ConnError::Mpa(MpaError::UnexpectedKind(frame.kind)), None);
                    return;
                }
                match mpa::responder_evaluate(&self.cfg.mpa, &frame) {
                    Ok(n) => {
                        self.neg = Some(n);
                        self.state = State::RequestReceived;
                        self.events.push_back(Event::ConnectRequest {
                            private_data: frame.private_data.clone(),
                            negotiated: n,
                        });
                        self.peer_req = Some(frame);
                    }
                    Err(e) => {
                        let rep = mpa::reject_reply(Some(&frame), &[]);
                        let _ = rep.encode(&mut self.raw_tx);
                        self.fail(ConnError::Negotiation(e), None);
                    }
                }
            }
            Role::Initiator => {
                if frame.kind != FrameKind::Reply {
                    let t = Terminate::new(TermError::llp(llp_ecode::INVALID_REQ_RESP));
                    self.fail(
                        ConnError::Mpa(MpaError::UnexpectedKind(frame.kind)),
                        Some(t),
                    );
                    return;
                }
                let req = self.sent_req.as_ref().expect("request sent");
                match mpa::initiator_evaluate(&self.cfg.mpa, req, &frame) {
                    Ok(n) => {
                        self.enter_rts(n);
                        if let Some(r) = n.rtr {
                            self.sq.push_front(SqEntry {
                                wr_id: 0,
                                op: SqOp::Rtr(r),
                                sent: 0,
                                state: SqState::Queued,
                                byte_len: 0,
                            });
                            self.sq_base = self.sq_base.wrapping_sub(1);
                        }
                        self.events.push_back(Event::Connected {
                            private_data: frame.private_data,
                            negotiated: n,
                        });
                        self.process_rx();
                    }
                    Err(NegotiationError::Rejected) => {
                        self.events.push_back(Event::Rejected {
                            private_data: frame.private_data,
                        });
                        self.fail(ConnError::Negotiation(NegotiationError::Rejected), None);
                    }
                    Err(e) => {
                        self.crc = frame.crc;
                        let term = match e {
                            NegotiationError::InsufficientIrd => {
                                Some(Terminate::new(TermError::llp(llp_ecode::INSUFFICIENT_IRD)))
                            }
                            NegotiationError::NoMatchingRtr => {
                                Some(Terminate::new(TermError::llp(llp_ecode::NO_MATCHING_RTR)))
                            }
                            _ => None,
                        };
                        self.fail(ConnError::Negotiation(e), term);
                    }
                }
            }
        }
    }

    fn process_rx(&mut self) {
        if self.state != State::Rts {
            return;
        }
        let Some(mut d) = self.deframer.take() else {
            return;
        };
        loop {
            match d.next_ulpdu() {
                Ok(None) => break,
                Ok(Some(u)) => {
                    self.tx_gated = false;
                    if let Err(te) = self.process_ulpdu(u) {
                        if let Some(te) = te {
                            let t = Terminate::new(te).with_offending(u);
                            self.fail(ConnError::LocalTerminate(te), Some(t));
                        }
                        break;
                    }
                }
                Err(e) => {
                    let te = match e {
                        FrameError::Crc { .. } => TermError::llp(llp_ecode::RECEIVED_CRC),
                        FrameError::TooLong { .. } => TermError::ddp_catastrophic(),
                    };
                    self.fail(ConnError::LocalTerminate(te), Some(Terminate::new(te)));
                    break;
                }
            }
        }
        self.deframer = Some(d);
        self.advance_completions();
    }

    /// `Err(Some(e))`: send a Terminate; `Err(None)`: stop (already failed).
    fn process_ulpdu(&mut self, u: &[u8]) -> Result<(), Option<TermError>> {
        let (h, payload) = Header::decode(u).map_err(Some)?;
        match h.ddp {
            DdpHdr::Tagged { stag, to } => match h.opcode {
                Opcode::Write => self.rx_write(h.last, stag, to, payload),
                Opcode::ReadResponse => self.rx_read_response(h.last, stag, to, payload),
                _ => Err(Some(TermError::rdmap(
                    rdmap_etype::REMOTE_OPERATION,
                    rdmap_ecode::OPCODE,
                ))),
            },
            DdpHdr::Untagged {
                rsvd_ulp,
                qn: q,
                msn,
                mo,
            } => match h.opcode {
                op if op.is_send() => {
                    if q != qn::SEND {
                        return Err(Some(TermError::ddp_untagged(ddp_ecode::UT_INVALID_QN)));
                    }
                    self.rx_send(op, h.last, rsvd_ulp, msn, mo, payload)
                }
                Opcode::ReadRequest => {
                    if q != qn::READ_REQUEST {
                        return Err(Some(TermError::ddp_untagged(ddp_ecode::UT_INVALID_QN)));
                    }
                    self.rx_read_request(h.last, msn, mo, payload)
                }
                Opcode::Terminate => {
                    if q != qn::TERMINATE {
                        return Err(Some(TermError::ddp_untagged(ddp_ecode::UT_INVALID_QN)));
                    }
                    let t = Terminate::decode(payload).unwrap_or_else(|| {
                        Terminate::new(TermError::rdmap(
                            rdmap_etype::CATASTROPHIC,
                            rdmap_ecode::UNSPECIFIED,
                        ))
                    });
                    self.fail(ConnError::RemoteTerminate(t), None);
                    Err(None)
                }
                _ => Err(Some(TermError::rdmap(
                    rdmap_etype::REMOTE_OPERATION,
                    rdmap_ecode::OPCODE,
                ))),
            },
        }
    }

    fn rx_write(
        &mut self,
        last: bool,
        stag: u32,
        to: u64,
        p: &[u8],
    ) -> Result<(), Option<TermError>> {
        match self.rx_write {
            Some((s, next)) => {
                if s != stag {
                    return Err(Some(TermError::ddp_tagged(ddp_ecode::T_INVALID_STAG)));
                }
                if next != to {
                    return Err(Some(TermError::ddp_tagged(ddp_ecode::T_BASE_BOUNDS)));
                }
            }
            // A zero-length single-segment Write is never checked (RTR).
            None if p.is_empty() && last => return Ok(()),
            None => {}
        }
        if !p.is_empty() {
            self.mem
                .write(stag, to, p, Access::REMOTE_WRITE)
                .map_err(|e| Some(e.ddp()))?;
        }
        let next = to
            .checked_add(p.len() as u64)
            .ok_or(Some(TermError::ddp_tagged(ddp_ecode::T_TO_WRAP)))?;
        self.rx_write = if last { None } else { Some((stag, next)) };
        self.peer_ops.write_bytes += p.len() as u64;
        if last {
            self.peer_ops.writes += 1;
        }
        Ok(())
    }

    fn rx_read_response(
        &mut self,
        last: bool,
        stag: u32,
        to: u64,
        p: &[u8],
    ) -> Result<(), Option<TermError>> {
        let Some(o) = self.orq.front_mut() else {
            return Err(Some(TermError::ddp_catastrophic()));
        };
        if stag != o.sink_stag {
            return Err(Some(TermError::ddp_tagged(ddp_ecode::T_INVALID_STAG)));
        }
        if to != o.sink_addr.wrapping_add(o.received as u64) {
            return Err(Some(TermError::ddp_tagged(ddp_ecode::T_BASE_BOUNDS)));
        }
        let total = o.received as u64 + p.len() as u64;
        if total > o.len as u64 || (last && total != o.len as u64) {
            return Err(Some(TermError::ddp_tagged(ddp_ecode::T_BASE_BOUNDS)));
        }
        if !p.is_empty() {
            if let Err(e) = self.mem.write(stag, to, p, Access::LOCAL_WRITE) {
                let idx = o.seq.wrapping_sub(self.sq_base) as usize;
                if let Some(e) = self.sq.get_mut(idx) {
                    e.state = SqState::Done(WcStatus::LocalProtection);
                }
                return Err(Some(e.ddp()));
            }
        }
        o.received = total as u32;
        if last {
            let o = self.orq.pop_front().expect("front");
            let idx = o.seq.wrapping_sub(self.sq_base) as usize;
            if let Some(e) = self.sq.get_mut(idx) {
                e.state = SqState::Done(WcStatus::Success);
            }
        }
        Ok(())
    }

    fn rx_send(
        &mut self,
        op: Opcode,
        last: bool,
        inval: u32,
        msn: u32,
        mo: u32,
        p: &[u8],
    ) -> Result<(), Option<TermError>> {
        if msn != self.rx_msn[qn::SEND as usize] {
            return Err(Some(TermError::ddp_untagged(
                ddp_ecode::UT_INVALID_MSN_RANGE,
            )));
        }
        let mut cur = match self.rx_send.take() {
            Some(c) => {
                if c.opcode != op {
                    self.rx_send = Some(c);
                    return Err(Some(TermError::ddp_catastrophic()));
                }
                c
            }
            None => {
                let Some(wr) = self.rq.pop_front() else {
                    return Err(Some(TermError::ddp_untagged(
                        ddp_ecode::UT_INVALID_MSN_NOBUF,
                    )));
                };
                RecvInProgress {
                    wr,
                    opcode: op,
                    received: 0,
                    inval,
                }
            }
        };
        if mo != cur.received {
            self.rx_send = Some(cur);
            return Err(Some(TermError::ddp_untagged(ddp_ecode::UT_INVALID_MO)));
        }
        let total = cur.received as u64 + p.len() as u64;
        if total > cur.wr.sge.len as u64 {
            self.push_completion(
                cur.wr.wr_id,
                WcOpcode::Recv,
                WcStatus::LocalLength,
                cur.received,
            );
            return Err(Some(TermError::ddp_untagged(ddp_ecode::UT_MSG_TOOLONG)));
        }
        if !p.is_empty() {
            let addr = cur.wr.sge.addr + cur.received as u64;
            if self
                .mem
                .write(cur.wr.sge.stag, addr, p, Access::LOCAL_WRITE)
                .is_err()
            {
                self.push_completion(
                    cur.wr.wr_id,
                    WcOpcode::Recv,
                    WcStatus::LocalProtection,
                    cur.received,
                );
                return Err(Some(TermError::ddp_catastrophic()));
            }
        }
        cur.received = total as u32;
        if !last {
            self.rx_send = Some(cur);
            return Ok(());
        }
        self.rx_msn[qn::SEND as usize] = self.rx_msn[qn::SEND as usize].wrapping_add(1);
        let invalidate = matches!(op, Opcode::SendInvalidate | Opcode::SendSeInvalidate);
        if invalidate && !self.mem.remote_invalidate(cur.inval) {
            self.push_completion(cur.wr.wr_id, WcOpcode::Recv, WcStatus::Fatal, cur.received);
            return Err(Some(TermError::rdmap(
                rdmap_etype::REMOTE_PROTECTION,
                rdmap_ecode::CANNOT_INVALIDATE,
            )));
        }
        self.events.push_back(Event::Completion(Completion {
            wr_id: cur.wr.wr_id,
            opcode: WcOpcode::Recv,
            status: WcStatus::Success,
            byte_len: cur.received,
            solicited: matches!(op, Opcode::SendSe | Opcode::SendSeInvalidate),
            invalidated: invalidate.then_some(cur.inval),
        }));
        Ok(())
    }

    fn rx_read_request(
        &mut self,
        last: bool,
        msn: u32,
        mo: u32,
        p: &[u8],
    ) -> Result<(), Option<TermError>> {
        if msn != self.rx_msn[qn::READ_REQUEST as usize] {
            return Err(Some(TermError::ddp_untagged(
                ddp_ecode::UT_INVALID_MSN_RANGE,
            )));
        }
        if mo != 0 || !last {
            return Err(Some(TermError::ddp_untagged(ddp_ecode::UT_INVALID_MO)));
        }
        let Some(rr) = ReadRequest::decode(p).filter(|_| p.len() == READ_REQ_LEN) else {
            return Err(Some(TermError::rdmap(
                rdmap_etype::REMOTE_OPERATION,
                rdmap_ecode::CATASTROPHIC_STREAM,
            )));
        };
        let ird = self.neg.map(|n| n.ird as usize).unwrap_or(0);
        if self.irq.len() >= ird.max(1) {
            return Err(Some(TermError::rdmap(
                rdmap_etype::REMOTE_OPERATION,
                rdmap_ecode::CATASTROPHIC_STREAM,
            )));
        }
        if rr.size > 0 {
            self.mem
                .check_access(
                    rr.src_stag,
                    rr.src_to,
                    rr.size as usize,
                    Access::REMOTE_READ,
                )
                .map_err(|e| Some(e.rdmap()))?;
        }
        self.rx_msn[qn::READ_REQUEST as usize] =
            self.rx_msn[qn::READ_REQUEST as usize].wrapping_add(1);
        self.peer_ops.read_requests += 1;
        self.peer_ops.read_bytes += u64::from(rr.size);
        self.irq.push_back(IrqEntry {
            sink_stag: rr.sink_stag,
            sink_to: rr.sink_to,
            src_stag: rr.src_stag,
            src_addr: rr.src_to,
            len: rr.size,
            sent: 0,
        });
        Ok(())
    }

    // -----------------------------------------------------------------------
    // Output
    // -----------------------------------------------------------------------

    /// Bytes to write to the TCP stream, if any (up to about
    /// [`Config::tx_batch`] bytes of whole FPDUs).
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        let mut v = Vec::new();
        self.poll_transmit_into(&mut v);
        (!v.is_empty()).then_some(v)
    }

    /// Appends bytes for the TCP stream to `out`; returns how many.
    pub fn poll_transmit_into(&mut self, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        if !self.raw_tx.is_empty() {
            out.append(&mut self.raw_tx);
        }
        if self.state == State::Rts {
            while out.len() - start < self.cfg.tx_batch {
                if !self.tx_one(out) {
                    break;
                }
                if self.state != State::Rts {
                    break;
                }
            }
            self.advance_completions();
        }
        if let Some(t) = self.term_tx.take() {
            self.hdr_scratch.clear();
            let msn = self.tx_msn[qn::TERMINATE as usize];
            self.tx_msn[qn::TERMINATE as usize] = msn.wrapping_add(1);
            Header::untagged(Opcode::Terminate, true, 0, qn::TERMINATE, msn, 0)
                .encode(&mut self.hdr_scratch);
            t.encode(&mut self.hdr_scratch);
            mpa::write_fpdu(out, &self.hdr_scratch, &[], self.crc);
        }
        out.len() - start
    }

    fn max_payload(&self, hdr: usize) -> usize {
        let fpdu = self.cfg.max_fpdu_len.clamp(64, u16::MAX as usize + 6);
        mpa::max_ulpdu_for_fpdu(fpdu) - hdr
    }

    fn tx_one(&mut self, out: &mut Vec<u8>) -> bool {
        if self.tx_gated {
            return false;
        }
        let ord = self.neg.map(|n| n.ord as usize).unwrap_or(0);
        let sq_ready = self.sq.get(self.sq_next).is_some_and(|e| match e.op {
            SqOp::User(WorkRequest::Read { .. }) | SqOp::Rtr(Rtr::Read) => {
                self.orq.len() < ord.max(1)
            }
            _ => true,
        });
        let irq_ready = !self.irq.is_empty();
        let src = match self.tx_cur {
            Some(s) => s,
            None if irq_ready && (self.prefer_irq || !sq_ready) => TxSource::Irq,
            None if sq_ready => TxSource::Sq,
            None => return false,
        };
        let done = match src {
            TxSource::Irq => self.tx_irq(out),
            TxSource::Sq => self.tx_sq(out),
        };
        match done {
            None => false,
            Some(true) => {
                self.tx_cur = None;
                self.prefer_irq = src == TxSource::Sq;
                true
            }
            Some(false) => {
                self.tx_cur = Some(src);
                true
            }
        }
    }

    /// One FPDU of the head read response. `Some(true)` at message end.
    fn tx_irq(&mut self, out: &mut Vec<u8>) -> Option<bool> {
        let maxp = self.max_payload(TAGGED_HDR_LEN);
        let e = self.irq.front_mut()?;
        let chunk = ((e.len - e.sent) as usize).min(maxp);
        let last = e.sent as usize + chunk == e.len as usize;
        let payload: &[u8] = if chunk == 0 {
            &[]
        } else {
            match self.mem.read(
                e.src_stag,
                e.src_addr + e.sent as u64,
                chunk,
                Access::REMOTE_READ,
            ) {
                Ok(p) => p,
                Err(err) => {
                    let te = err.rdmap();
                    self.fail(ConnError::LocalTerminate(te), Some(Terminate::new(te)));
                    return None;
                }
            }
        };
        self.hdr_scratch.clear();
        Header::tagged(
            Opcode::ReadResponse,
            last,
            e.sink_stag,
            e.sink_to.wrapping_add(e.sent as u64),
        )
        .encode(&mut self.hdr_scratch);
        mpa::write_fpdu(out, &self.hdr_scratch, payload, self.crc);
        e.sent += chunk as u32;
        if last {
            self.irq.pop_front();
        }
        Some(last)
    }

    /// One FPDU of the current SQ entry. `Some(true)` at message end.
    fn tx_sq(&mut self, out: &mut Vec<u8>) -> Option<bool> {
        let idx = self.sq_next;
        let crc = self.crc;
        let maxp_t = self.max_payload(TAGGED_HDR_LEN);
        let maxp_u = self.max_payload(UNTAGGED_HDR_LEN);
        let e = self.sq.get_mut(idx)?;
        self.hdr_scratch.clear();
        match e.op {
            SqOp::Rtr(Rtr::Write) => {
                // siw uses STag 1: some hardware treats STag 0 specially.
                Header::tagged(Opcode::Write, true, 1, 0).encode(&mut self.hdr_scratch);
                mpa::write_fpdu(out, &self.hdr_scratch, &[], crc);
                e.state = SqState::Done(WcStatus::Success);
                self.sq_next += 1;
                Some(true)
            }
            SqOp::Rtr(Rtr::Read) | SqOp::User(WorkRequest::Read { .. }) => {
                let (rr, seq) = match e.op {
                    SqOp::User(WorkRequest::Read {
                        local,
                        remote_stag,
                        remote_addr,
                    }) => (
                        ReadRequest {
                            sink_stag: local.stag,
                            sink_to: local.addr,
                            size: local.len,
                            src_stag: remote_stag,
                            src_to: remote_addr,
                        },
                        self.sq_base.wrapping_add(idx as u64),
                    ),
                    _ => (
                        ReadRequest {
                            src_stag: 1,
                            ..ReadRequest::default()
                        },
                        self.sq_base.wrapping_add(idx as u64),
                    ),
                };
                let msn = self.tx_msn[qn::READ_REQUEST as usize];
                self.tx_msn[qn::READ_REQUEST as usize] = msn.wrapping_add(1);
                Header::untagged(Opcode::ReadRequest, true, 0, qn::READ_REQUEST, msn, 0)
                    .encode(&mut self.hdr_scratch);
                rr.encode(&mut self.hdr_scratch);
                mpa::write_fpdu(out, &self.hdr_scratch, &[], crc);
                e.state = SqState::ReadInFlight;
                self.orq.push_back(OrqEntry {
                    seq,
                    sink_stag: rr.sink_stag,
                    sink_addr: rr.sink_to,
                    len: rr.size,
                    received: 0,
                });
                self.sq_next += 1;
                Some(true)
            }
            SqOp::User(WorkRequest::Send {
                local,
                solicited,
                invalidate,
            }) => {
                let Some((payload, last)) = local_chunk(&self.mem, &local, e.sent, maxp_u) else {
                    e.state = SqState::Done(WcStatus::LocalProtection);
                    self.fail_local_protection();
                    return None;
                };
                let op = match (solicited, invalidate.is_some()) {
                    (false, false) => Opcode::Send,
                    (false, true) => Opcode::SendInvalidate,
                    (true, false) => Opcode::SendSe,
                    (true, true) => Opcode::SendSeInvalidate,
                };
                let msn = self.tx_msn[qn::SEND as usize];
                Header::untagged(op, last, invalidate.unwrap_or(0), qn::SEND, msn, e.sent)
                    .encode(&mut self.hdr_scratch);
                mpa::write_fpdu(out, &self.hdr_scratch, payload, crc);
                e.sent += payload.len() as u32;
                if last {
                    self.tx_msn[qn::SEND as usize] = msn.wrapping_add(1);
                    e.state = SqState::Done(WcStatus::Success);
                    self.sq_next += 1;
                }
                Some(last)
            }
            SqOp::User(WorkRequest::Write {
                local,
                remote_stag,
                remote_addr,
            }) => {
                let Some((payload, last)) = local_chunk(&self.mem, &local, e.sent, maxp_t) else {
                    e.state = SqState::Done(WcStatus::LocalProtection);
                    self.fail_local_protection();
                    return None;
                };
                Header::tagged(
                    Opcode::Write,
                    last,
                    remote_stag,
                    remote_addr.wrapping_add(e.sent as u64),
                )
                .encode(&mut self.hdr_scratch);
                mpa::write_fpdu(out, &self.hdr_scratch, payload, crc);
                e.sent += payload.len() as u32;
                if last {
                    e.state = SqState::Done(WcStatus::Success);
                    self.sq_next += 1;
                }
                Some(last)
            }
        }
    }

    // -----------------------------------------------------------------------
    // Completions and errors
    // -----------------------------------------------------------------------

    fn push_completion(&mut self, wr_id: u64, opcode: WcOpcode, status: WcStatus, byte_len: u32) {
        self.events.push_back(Event::Completion(Completion {
            wr_id,
            opcode,
            status,
            byte_len,
            solicited: false,
            invalidated: None,
        }));
    }

    /// Emits SQ completions in posting order.
    fn advance_completions(&mut self) {
        while let Some(e) = self.sq.front() {
            let SqState::Done(status) = e.state else {
                break;
            };
            let e = self.sq.pop_front().expect("front");
            self.sq_base = self.sq_base.wrapping_add(1);
            self.sq_next = self.sq_next.saturating_sub(1);
            let opcode = match e.op {
                SqOp::Rtr(_) => continue,
                SqOp::User(WorkRequest::Send { .. }) => WcOpcode::Send,
                SqOp::User(WorkRequest::Write { .. }) => WcOpcode::Write,
                SqOp::User(WorkRequest::Read { .. }) => WcOpcode::Read,
            };
            let byte_len = if status == WcStatus::Success {
                e.byte_len
            } else {
                0
            };
            self.push_completion(e.wr_id, opcode, status, byte_len);
        }
    }

    /// Flushes every outstanding work request.
    fn flush(&mut self) {
        for e in self.sq.iter_mut() {
            if !matches!(e.state, SqState::Done(_)) {
                e.state = SqState::Done(WcStatus::Flushed);
            }
        }
        self.advance_completions();
        self.sq_next = 0;
        if let Some(r) = self.rx_send.take() {
            self.push_completion(r.wr.wr_id, WcOpcode::Recv, WcStatus::Flushed, 0);
        }
        while let Some(r) = self.rq.pop_front() {
            self.push_completion(r.wr_id, WcOpcode::Recv, WcStatus::Flushed, 0);
        }
        self.orq.clear();
        self.irq.clear();
    }

    /// Moves to the error state: optional Terminate to send, an error event,
    /// flushed work requests, then [`Event::Closed`].
    /// A local buffer could not be read: catastrophic Terminate, connection error.
    fn fail_local_protection(&mut self) {
        let te = TermError::rdmap(rdmap_etype::CATASTROPHIC, rdmap_ecode::UNSPECIFIED);
        self.fail(ConnError::LocalProtection, Some(Terminate::new(te)));
    }

    fn fail(&mut self, err: ConnError, term: Option<Terminate>) {
        if matches!(self.state, State::Error | State::Closed) {
            return;
        }
        self.state = State::Error;
        self.term_tx = term;
        self.tx_cur = None;
        self.events.push_back(Event::Error(err));
        self.flush();
        self.events.push_back(Event::Closed);
    }
}

/// The next FPDU's payload of a work request's local buffer: at most
/// `max_payload` bytes from offset `sent`, and whether it ends the message;
/// `None` when the memory table refuses the read.
fn local_chunk<'a>(
    mem: &'a MemTable,
    local: &Sge,
    sent: u32,
    max_payload: usize,
) -> Option<(&'a [u8], bool)> {
    let chunk = ((local.len - sent) as usize).min(max_payload);
    let last = sent as usize + chunk == local.len as usize;
    if chunk == 0 {
        return Some((&[], last));
    }
    mem.read(local.stag, local.addr + sent as u64, chunk, Access::NONE)
        .ok()
        .map(|payload| (payload, last))
}
