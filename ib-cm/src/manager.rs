//! Sans-IO connection manager: the passive (listen/accept) and active
//! (connect) sides of IB CM RC connection setup and teardown, as Linux's
//! `ib_cm` runs them over the GSI QP.
//!
//! MADs in (`handle_mad(peer, bytes, now)`), MADs out (`poll_transmit`),
//! events out (`poll_event`), timers by `poll_timeout` / `handle_timeout`.
//! The caller owns the QPs: a passive connection reports the peer's REQ
//! (`CmEvent::ConnectRequest`) and waits for `accept` (with our QPN/PSN)
//! or `reject`; an active one is started with our QPN/PSN and reports the
//! peer's QP once its REP arrives (`CmEvent::Established`).

use crate::error::CmError;
use crate::msg::{
    cm_timeout, reject_reason, CmMad, CmMessage, Drep, Dreq, Mra, PathInfo, Rej, Rep, Req, Rtu,
    MSG_OTHER, MSG_REP, MSG_REQ,
};
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Limits and timing of a `CmManager`.
#[derive(Debug, Clone)]
pub struct CmConfig {
    /// Our CA GUID (REQ/REP `local_ca_guid`).
    pub local_ca_guid: u64,
    /// Live connections at most (any state); a REQ beyond is rejected
    /// with `NO_RESOURCES` and counted.
    pub max_connections: usize,
    /// Connections still in setup per listener (REQ received, REP sent).
    pub max_pending_per_listener: usize,
    /// Listeners at most.
    pub max_listeners: usize,
    /// Outgoing MADs queued at most (more are dropped and counted; the
    /// retransmit timers recover).
    pub max_queued_mads: usize,
    /// Events queued at most (more are dropped and counted).
    pub max_queued_events: usize,
    /// How long we wait for an answer before resending.
    pub response_timeout: Duration,
    /// Resends before a connection fails.
    pub max_retries: u8,
    /// How long a REQ may wait for `accept`/`reject`.
    pub accept_timeout: Duration,
    /// The 5-bit CM response timeout code we announce (20 ≈ 4.3 s, as rdma_cm).
    pub response_timeout_code: u8,
    /// Max CM retries we announce in a REQ (rdma_cm: 15).
    pub announced_cm_retries: u8,
}

impl Default for CmConfig {
    fn default() -> Self {
        Self {
            local_ca_guid: 0x0200_00ff_fe00_0001,
            max_connections: 256,
            max_pending_per_listener: 16,
            max_listeners: 64,
            max_queued_mads: 256,
            max_queued_events: 256,
            response_timeout: Duration::from_millis(1500),
            max_retries: 10,
            accept_timeout: Duration::from_secs(10),
            response_timeout_code: 20,
            announced_cm_retries: 15,
        }
    }
}

/// Identifies a connection: our local communication ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u32);

/// The peer's QP as the handshake established it, for moving our QP to RTR/RTS.
/// The default (all zero, no private data) stands in where a connection has
/// no record of its peer's QP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemoteQp {
    /// Peer QPN.
    pub qpn: u32,
    /// The peer's starting PSN: the PSN it expects to receive, i.e. our
    /// send PSN (Linux and rxe read it that way: REQ → the passive side's
    /// sq_psn, REP → the active side's sq_psn).
    pub starting_psn: u32,
    /// Reads/atomics the peer accepts from us (our max_rd_atomic bound).
    pub responder_resources: u8,
    /// Reads/atomics the peer may send us (our max_dest_rd_atomic bound).
    pub initiator_depth: u8,
    /// Path MTU code (1 = 256 … 5 = 4096) of the REQ.
    pub path_mtu: u8,
    /// Transport retry count of the REQ.
    pub retry_count: u8,
    /// RNR retry count the peer asks us to use.
    pub rnr_retry_count: u8,
    /// The peer's private data (REQ: rdma_cm header + application data; REP: application data).
    pub private_data: Vec<u8>,
}

/// What our side offers: its QP, for `accept` and `connect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalQp {
    /// Our QPN.
    pub qpn: u32,
    /// Our starting PSN: the first PSN we expect to receive (the peer's
    /// send PSN).
    pub starting_psn: u32,
    /// Reads/atomics we accept (our max_dest_rd_atomic).
    pub responder_resources: u8,
    /// Reads/atomics we may issue (our max_rd_atomic).
    pub initiator_depth: u8,
    /// RNR retry count the peer should use towards us.
    pub rnr_retry_count: u8,
    /// Private data for the REP or the REQ.
    pub private_data: Vec<u8>,
}

/// Parameters of an active connection (`connect`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    /// Service ID (rdma_cm: `cma::service_id(RDMA_PS_TCP, port)`).
    pub service_id: u64,
    /// Our QP.
    pub local: LocalQp,
    /// Path MTU code.
    pub path_mtu: u8,
    /// Transport retry count.
    pub retry_count: u8,
    /// Our GID.
    pub local_gid: [u8; 16],
    /// The peer's GID.
    pub remote_gid: [u8; 16],
}

/// Why a connection ended without a peer's REJ/DREQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmFailure {
    /// The peer did not answer (after retries) or the caller did not accept in time.
    Timeout,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for one of our listeners: `accept` or `reject` it.
    ConnectRequest {
        /// The new connection.
        conn: ConnId,
        /// Where it came from.
        peer: IpAddr,
        /// The listener's service ID.
        service_id: u64,
        /// The peer's QP and private data.
        remote: RemoteQp,
    },
    /// The handshake completed (passive: RTU or first data; active: REP answered with RTU).
    Established {
        /// Connection.
        conn: ConnId,
        /// The peer's QP.
        remote: RemoteQp,
    },
    /// The peer rejected (or a REJ arrived mid-handshake).
    Rejected {
        /// Connection.
        conn: ConnId,
        /// REJ reason.
        reason: u16,
    },
    /// Disconnected (DREQ received, or DREP/timeout after our DREQ).
    Disconnected {
        /// Connection.
        conn: ConnId,
    },
    /// Setup failed locally.
    Failed {
        /// Connection.
        conn: ConnId,
        /// Why.
        failure: CmFailure,
    },
}

impl CmEvent {
    /// The connection the event is about.
    pub fn conn(&self) -> ConnId {
        match self {
            CmEvent::ConnectRequest { conn, .. }
            | CmEvent::Established { conn, .. }
            | CmEvent::Rejected { conn, .. }
            | CmEvent::Disconnected { conn }
            | CmEvent::Failed { conn, .. } => *conn,
        }
    }
}

/// A MAD to send to `peer`'s GSI QP (QP1, Q_Key 0x80010000).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingMad {
    /// Destination.
    pub peer: IpAddr,
    /// The 256-byte MAD.
    pub mad: [u8; crate::msg::MAD_LEN],
}

/// Counters (never reset).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CmCounters {
    /// MADs handed to `handle_mad`.
    pub mads_in: u64,
    /// MADs queued for sending.
    pub mads_out: u64,
    /// MADs that did not parse (truncated, wrong class/version/method, unknown attribute).
    pub parse_errors: u64,
    /// REQs for a service nobody listens on (answered with REJ).
    pub unknown_service: u64,
    /// REQs refused by `max_connections` / `max_pending_per_listener`.
    pub limit_rejects: u64,
    /// REJs sent.
    pub rejects_sent: u64,
    /// REJs received.
    pub rejects_received: u64,
    /// Messages for no known connection or from the wrong peer.
    pub stale: u64,
    /// Duplicates answered (REQ → REP again, REP → RTU again).
    pub duplicates: u64,
    /// Resent REQ/REP/DREQ after a timeout.
    pub retransmits: u64,
    /// Connections failed by timeout.
    pub timeouts: u64,
    /// MADs or events dropped because a queue was full.
    pub queue_drops: u64,
    /// Connections established.
    pub established: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Passive: REQ reported, waiting for accept/reject.
    ReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Active: REQ sent, waiting for REP.
    ReqSent,
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            Self::ReqRcvd => "REQ received",
            Self::RepSent => "REP sent",
            Self::ReqSent => "REQ sent",
            Self::Established => "established",
            Self::DreqSent => "DREQ sent",
        }
    }
}

#[derive(Debug)]
struct Conn {
    peer: IpAddr,
    state: State,
    remote_comm_id: u32,
    /// TID of the REQ (REP/RTU/REJ/MRA reuse it).
    tid: u64,
    /// Listener service ID (passive) or target (active).
    service_id: u64,
    passive: bool,
    remote: Option<RemoteQp>,
    /// The last REQ/REP/DREQ we sent, for resends.
    last_sent: Option<[u8; crate::msg::MAD_LEN]>,
    deadline: Option<Instant>,
    retries_left: u8,
}

/// The CM of one port: listeners and connections.
#[derive(Debug)]
pub struct CmManager {
    cfg: CmConfig,
    listeners: HashSet<u64>,
    conns: HashMap<u32, Conn>,
    next_id: u32,
    next_tid: u32,
    out: VecDeque<OutgoingMad>,
    events: VecDeque<CmEvent>,
    counters: CmCounters,
}

impl CmManager {
    /// A manager; `seed` picks the first communication ID (so that two
    /// managers, or restarts, do not reuse each other's IDs).
    pub fn new(cfg: CmConfig, seed: u32) -> Self {
        Self {
            cfg,
            listeners: HashSet::new(),
            conns: HashMap::new(),
            next_id: seed.max(1),
            next_tid: 1,
            out: VecDeque::new(),
            events: VecDeque::new(),
            counters: CmCounters::default(),
        }
    }

    /// Counters.
    pub fn counters(&self) -> &CmCounters {
        &self.counters
    }

    /// Live connections (any state).
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Accept REQs for `service_id`.
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if self.listeners.contains(&service_id) {
            return Err(CmError::AlreadyListening(service_id));
        }
        if self.listeners.len() >= self.cfg.max_listeners {
            return Err(CmError::Limit("listeners"));
        }
        self.listeners.insert(service_id);
        Ok(())
    }

    /// Stop accepting REQs for `service_id` (existing connections stay).
    pub fn unlisten(&mut self, service_id: u64) {
        self.listeners.remove(&service_id);
    }

    /// Next MAD to send.
    pub fn poll_transmit(&mut self) -> Option<OutgoingMad> {
        self.out.pop_front()
    }

    /// Next event.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// Earliest timer.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conns.values().filter_map(|c| c.deadline).min()
    }

    fn alloc_id(&mut self) -> u32 {
        loop {
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1).max(1);
            if !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    fn alloc_tid(&mut self, id: u32) -> u64 {
        // Upper half: a sequence; lower: the comm ID (as Linux forms TIDs).
        let t = (u64::from(self.next_tid) << 32) | u64::from(id);
        self.next_tid = self.next_tid.wrapping_add(1);
        t
    }

    fn push_event(&mut self, e: CmEvent) {
        if self.events.len() >= self.cfg.max_queued_events {
            self.counters.queue_drops += 1;
        } else {
            self.events.push_back(e);
        }
    }

    fn send(&mut self, peer: IpAddr, mad: &CmMad) -> Option<[u8; crate::msg::MAD_LEN]> {
        // Our own messages always fit (private data is checked by callers).
        let bytes = mad.encode().ok()?;
        self.send_bytes(peer, bytes);
        Some(bytes)
    }

    fn send_bytes(&mut self, peer: IpAddr, mad: [u8; crate::msg::MAD_LEN]) {
        if self.out.len() >= self.cfg.max_queued_mads {
            self.counters.queue_drops += 1;
            return;
        }
        self.counters.mads_out += 1;
        self.out.push_back(OutgoingMad { peer, mad });
    }

    fn send_rej(&mut self, peer: IpAddr, tid: u64, local: u32, remote: u32, msg: u8, reason: u16) {
        self.counters.rejects_sent += 1;
        let rej = CmMad {
            tid,
            msg: CmMessage::Rej(Rej {
                local_comm_id: local,
                remote_comm_id: remote,
                message_rejected: msg,
                reason,
                ..Rej::default()
            }),
        };
        self.send(peer, &rej);
    }

    /// Feeds a MAD received on the GSI QP from `peer` (the sender's IP).
    /// Bad MADs are counted and returned as errors; nothing is sent for them.
    pub fn handle_mad(&mut self, peer: IpAddr, bytes: &[u8], now: Instant) -> Result<(), CmError> {
        self.counters.mads_in += 1;
        let mad = match CmMad::parse(bytes) {
            Ok(m) => m,
            Err(e) => {
                self.counters.parse_errors += 1;
                return Err(e);
            }
        };
        let tid = mad.tid;
        match mad.msg {
            CmMessage::Req(req) => self.on_req(peer, tid, *req, now),
            CmMessage::Rep(rep) => self.on_rep(peer, tid, rep),
            CmMessage::Rtu(rtu) => self.on_rtu(peer, &rtu),
            CmMessage::Rej(rej) => self.on_rej(peer, &rej),
            CmMessage::Mra(mra) => self.on_mra(peer, &mra, now),
            CmMessage::Dreq(dreq) => self.on_dreq(peer, tid, &dreq),
            CmMessage::Drep(drep) => self.on_drep(peer, &drep),
        }
        Ok(())
    }

    fn conn_for(&mut self, peer: IpAddr, local_id: u32) -> Option<&mut Conn> {
        match self.conns.get_mut(&local_id) {
            Some(c) if c.peer == peer => Some(c),
            _ => {
                self.counters.stale += 1;
                None
            }
        }
    }

    fn on_req(&mut self, peer: IpAddr, tid: u64, req: Req, now: Instant) {
        // A resent REQ of a connection we know: answer as before.
        if let Some((&id, c)) = self
            .conns
            .iter()
            .find(|(_, c)| c.passive && c.peer == peer && c.remote_comm_id == req.local_comm_id)
        {
            self.counters.duplicates += 1;
            match c.state {
                State::RepSent => {
                    if let Some(b) = c.last_sent {
                        self.send_bytes(peer, b);
                    }
                }
                State::ReqRcvd => {
                    // Ask for patience while the caller decides.
                    let mra = CmMad {
                        tid,
                        msg: CmMessage::Mra(Mra {
                            local_comm_id: id,
                            remote_comm_id: req.local_comm_id,
                            message_mraed: MSG_REQ,
                            service_timeout: self.cfg.response_timeout_code,
                            private_data: Vec::new(),
                        }),
                    };
                    self.send(peer, &mra);
                }
                _ => {}
            }
            return;
        }
        if !self.listeners.contains(&req.service_id) {
            self.counters.unknown_service += 1;
            self.send_rej(
                peer,
                tid,
                0,
                req.local_comm_id,
                MSG_REQ,
                reject_reason::INVALID_SERVICE_ID,
            );
            return;
        }
        if req.transport_type != 0 || req.extended_transport_type != 0 {
            self.send_rej(
                peer,
                tid,
                0,
                req.local_comm_id,
                MSG_REQ,
                reject_reason::INVALID_TRANSPORT_TYPE,
            );
            return;
        }
        let pending = self
            .conns
            .values()
            .filter(|c| {
                c.passive
                    && c.service_id == req.service_id
                    && matches!(c.state, State::ReqRcvd | State::RepSent)
            })
            .count();
        if self.conns.len() >= self.cfg.max_connections
            || pending >= self.cfg.max_pending_per_listener
        {
            self.counters.limit_rejects += 1;
            self.send_rej(
                peer,
                tid,
                0,
                req.local_comm_id,
                MSG_REQ,
                reject_reason::NO_RESOURCES,
            );
            return;
        }
        let id = self.alloc_id();
        let remote = RemoteQp {
            qpn: req.local_qpn,
            starting_psn: req.starting_psn,
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            path_mtu: req.path_mtu,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            private_data: req.private_data,
        };
        self.conns.insert(
            id,
            Conn {
                peer,
                state: State::ReqRcvd,
                remote_comm_id: req.local_comm_id,
                tid,
                service_id: req.service_id,
                passive: true,
                remote: Some(remote.clone()),
                last_sent: None,
                deadline: Some(now + self.cfg.accept_timeout),
                retries_left: 0,
            },
        );
        self.push_event(CmEvent::ConnectRequest {
            conn: ConnId(id),
            peer,
            service_id: req.service_id,
            remote,
        });
    }

    fn wrong_state(id: u32, c: &Conn, op: &'static str) -> CmError {
        CmError::WrongState {
            id,
            state: c.state.name(),
            op,
        }
    }

    /// Connection `conn`, which `op` (accept or reject) needs to be in
    /// REQ received: the REQ still waits for the application's answer.
    fn req_rcvd(&self, conn: ConnId, op: &'static str) -> Result<&Conn, CmError> {
        let c = self
            .conns
            .get(&conn.0)
            .ok_or(CmError::UnknownConnection(conn.0))?;
        if c.state != State::ReqRcvd {
            return Err(Self::wrong_state(conn.0, c, op));
        }
        Ok(c)
    }

    /// Accepts a REQ reported by `ConnectRequest`: sends the REP.
    /// `local.responder_resources` / `initiator_depth` are clamped to what
    /// the REQ asked for, as the IB CM requires.
    pub fn accept(&mut self, conn: ConnId, local: LocalQp, now: Instant) -> Result<(), CmError> {
        let guid = self.cfg.local_ca_guid;
        let c = self.req_rcvd(conn, "accept")?;
        let remote = c.remote.clone().unwrap_or_default();
        let rep = CmMad {
            tid: c.tid,
            msg: CmMessage::Rep(Rep {
                local_comm_id: conn.0,
                remote_comm_id: c.remote_comm_id,
                local_qpn: local.qpn & 0xff_ffff,
                starting_psn: local.starting_psn & 0xff_ffff,
                // Our responder resources answer their initiator depth and v.v.
                responder_resources: local.responder_resources.min(remote.initiator_depth),
                initiator_depth: local.initiator_depth.min(remote.responder_resources),
                target_ack_delay: 0,
                failover_accepted: 3, // "unsupported", no alternate path
                rnr_retry_count: local.rnr_retry_count & 7,
                local_ca_guid: guid,
                private_data: local.private_data.clone(),
                ..Rep::default()
            }),
        };
        let bytes = rep.encode()?;
        let peer = c.peer;
        let (timeout, retries) = (self.cfg.response_timeout, self.cfg.max_retries);
        let c = self
            .conns
            .get_mut(&conn.0)
            .ok_or(CmError::UnknownConnection(conn.0))?;
        c.state = State::RepSent;
        c.last_sent = Some(bytes);
        c.deadline = Some(now + timeout);
        c.retries_left = retries;
        self.send_bytes(peer, bytes);
        Ok(())
    }

    /// Rejects a REQ (`CONSUMER_DEFINED` for an application's refusal).
    pub fn reject(&mut self, conn: ConnId, reason: u16) -> Result<(), CmError> {
        let c = self.req_rcvd(conn, "reject")?;
        let (peer, tid, remote) = (c.peer, c.tid, c.remote_comm_id);
        self.conns.remove(&conn.0);
        self.send_rej(peer, tid, conn.0, remote, MSG_REQ, reason);
        Ok(())
    }

    /// Starts an active connection to `peer`: sends the REQ.
    pub fn connect(
        &mut self,
        peer: IpAddr,
        p: ConnectParams,
        now: Instant,
    ) -> Result<ConnId, CmError> {
        if self.conns.len() >= self.cfg.max_connections {
            self.counters.limit_rejects += 1;
            return Err(CmError::Limit("connections"));
        }
        let id = self.alloc_id();
        let tid = self.alloc_tid(id);
        let path = PathInfo {
            // RoCE: LIDs are "permissive", the GIDs carry the addresses.
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: p.local_gid,
            remote_gid: p.remote_gid,
            hop_limit: 64,
            local_ack_timeout: 14,
            ..PathInfo::default()
        };
        let req = CmMad {
            tid,
            msg: CmMessage::Req(Box::new(Req {
                local_comm_id: id,
                service_id: p.service_id,
                local_ca_guid: self.cfg.local_ca_guid,
                local_qpn: p.local.qpn & 0xff_ffff,
                responder_resources: p.local.responder_resources,
                initiator_depth: p.local.initiator_depth,
                remote_cm_response_timeout: self.cfg.response_timeout_code,
                starting_psn: p.local.starting_psn & 0xff_ffff,
                local_cm_response_timeout: self.cfg.response_timeout_code,
                retry_count: p.retry_count & 7,
                pkey: 0xffff,
                path_mtu: p.path_mtu & 0xf,
                rnr_retry_count: p.local.rnr_retry_count & 7,
                max_cm_retries: self.cfg.announced_cm_retries & 0xf,
                primary_path: path,
                private_data: p.local.private_data.clone(),
                ..Req::default()
            })),
        };
        let bytes = req.encode()?;
        self.conns.insert(
            id,
            Conn {
                peer,
                state: State::ReqSent,
                remote_comm_id: 0,
                tid,
                service_id: p.service_id,
                passive: false,
                remote: Some(RemoteQp {
                    qpn: 0,
                    starting_psn: 0,
                    responder_resources: 0,
                    initiator_depth: 0,
                    path_mtu: p.path_mtu,
                    retry_count: p.retry_count,
                    rnr_retry_count: 0,
                    private_data: Vec::new(),
                }),
                last_sent: Some(bytes),
                deadline: Some(now + self.cfg.response_timeout),
                retries_left: self.cfg.max_retries,
            },
        );
        self.send_bytes(peer, bytes);
        Ok(ConnId(id))
    }

    fn on_rep(&mut self, peer: IpAddr, tid: u64, rep: Rep) {
        let id = rep.remote_comm_id;
        let Some(c) = self.conn_for(peer, id) else {
            return;
        };
        if c.passive {
            self.counters.stale += 1;
            return;
        }
        match c.state {
            State::ReqSent => {}
            State::Established if c.remote_comm_id == rep.local_comm_id => {
                // Our RTU was lost: send it again.
                let rtu = CmMad {
                    tid,
                    msg: CmMessage::Rtu(Rtu {
                        local_comm_id: id,
                        remote_comm_id: rep.local_comm_id,
                        private_data: Vec::new(),
                    }),
                };
                self.counters.duplicates += 1;
                self.send(peer, &rtu);
                return;
            }
            _ => {
                self.counters.stale += 1;
                return;
            }
        }
        let mut remote = c.remote.take().unwrap_or_default();
        remote.qpn = rep.local_qpn;
        remote.starting_psn = rep.starting_psn;
        remote.responder_resources = rep.responder_resources;
        remote.initiator_depth = rep.initiator_depth;
        remote.rnr_retry_count = rep.rnr_retry_count;
        remote.private_data = rep.private_data;
        c.remote = Some(remote.clone());
        c.remote_comm_id = rep.local_comm_id;
        c.state = State::Established;
        c.deadline = None;
        c.last_sent = None;
        let rtu = CmMad {
            tid: c.tid,
            msg: CmMessage::Rtu(Rtu {
                local_comm_id: id,
                remote_comm_id: rep.local_comm_id,
                private_data: Vec::new(),
            }),
        };
        self.send(peer, &rtu);
        self.counters.established += 1;
        self.push_event(CmEvent::Established {
            conn: ConnId(id),
            remote,
        });
    }

    fn establish_passive(&mut self, id: u32) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.state = State::Established;
        c.deadline = None;
        c.last_sent = None;
        let remote = c.remote.clone();
        self.counters.established += 1;
        if let Some(remote) = remote {
            self.push_event(CmEvent::Established {
                conn: ConnId(id),
                remote,
            });
        }
    }

    fn on_rtu(&mut self, peer: IpAddr, rtu: &Rtu) {
        let id = rtu.remote_comm_id;
        let Some(c) = self.conn_for(peer, id) else {
            return;
        };
        if !c.passive || c.remote_comm_id != rtu.local_comm_id {
            self.counters.stale += 1;
            return;
        }
        match c.state {
            State::RepSent => self.establish_passive(id),
            // A late RTU after the first data already established us.
            State::Established | State::DreqSent => self.counters.duplicates += 1,
            _ => self.counters.stale += 1,
        }
    }

    /// The caller saw the first packet on a passive connection's QP before
    /// the RTU (it was lost): treat the connection as established
    /// (`ib_cm_notify(IB_EVENT_COMM_EST)` in Linux).
    pub fn notify_established(&mut self, conn: ConnId) {
        if self
            .conns
            .get(&conn.0)
            .is_some_and(|c| c.state == State::RepSent)
        {
            self.establish_passive(conn.0);
        }
    }

    fn on_rej(&mut self, peer: IpAddr, rej: &Rej) {
        self.counters.rejects_received += 1;
        // A REJ of our REQ carries no comm ID of theirs to check
        // (it may be 0); one of our REP carries theirs.
        // An active side that gives up before our REP reached it does not
        // know our ID (0): find the connection by its own ID instead.
        let by_theirs = self
            .conns
            .iter()
            .find(|(_, c)| c.passive && c.peer == peer && c.remote_comm_id == rej.local_comm_id)
            .map(|(&id, _)| id);
        let id = match (rej.remote_comm_id, by_theirs) {
            (0, Some(id)) => id,
            (id, _) => id,
        };
        let Some(c) = self.conn_for(peer, id) else {
            return;
        };
        if c.remote_comm_id != 0 && rej.local_comm_id != 0 && c.remote_comm_id != rej.local_comm_id
        {
            self.counters.stale += 1;
            return;
        }
        self.conns.remove(&id);
        self.push_event(CmEvent::Rejected {
            conn: ConnId(id),
            reason: rej.reason,
        });
    }

    fn on_mra(&mut self, peer: IpAddr, mra: &Mra, now: Instant) {
        let extra = cm_timeout(mra.service_timeout) + self.cfg.response_timeout;
        let Some(c) = self.conn_for(peer, mra.remote_comm_id) else {
            return;
        };
        let fits = matches!(
            (c.state, mra.message_mraed),
            (State::ReqSent, MSG_REQ) | (State::RepSent, MSG_REP)
        );
        if fits {
            // The peer got our message and needs time: wait, without
            // spending a retry.
            c.deadline = Some(now + extra.min(Duration::from_secs(60)));
        }
    }

    fn on_dreq(&mut self, peer: IpAddr, tid: u64, dreq: &Dreq) {
        let id = dreq.remote_comm_id;
        let known = self.conns.get(&id).is_some_and(|c| {
            c.peer == peer
                && c.remote_comm_id == dreq.local_comm_id
                && matches!(
                    c.state,
                    State::Established | State::RepSent | State::DreqSent
                )
        });
        // Answer even for a connection we no longer know (its DREP was
        // lost): the peer waits for it.
        let drep = CmMad {
            tid,
            msg: CmMessage::Drep(Drep {
                local_comm_id: id,
                remote_comm_id: dreq.local_comm_id,
                private_data: Vec::new(),
            }),
        };
        self.send(peer, &drep);
        if known {
            self.conns.remove(&id);
            self.push_event(CmEvent::Disconnected { conn: ConnId(id) });
        } else {
            self.counters.stale += 1;
        }
    }

    fn on_drep(&mut self, peer: IpAddr, drep: &Drep) {
        let id = drep.remote_comm_id;
        let Some(c) = self.conn_for(peer, id) else {
            return;
        };
        if c.state != State::DreqSent {
            self.counters.stale += 1;
            return;
        }
        self.conns.remove(&id);
        self.push_event(CmEvent::Disconnected { conn: ConnId(id) });
    }

    /// Disconnects an established connection (DREQ). A connection still in
    /// setup is rejected instead (and dropped at once).
    pub fn disconnect(&mut self, conn: ConnId, now: Instant) -> Result<(), CmError> {
        let c = self
            .conns
            .get(&conn.0)
            .ok_or(CmError::UnknownConnection(conn.0))?;
        let (peer, remote_id, state, tid) = (c.peer, c.remote_comm_id, c.state, c.tid);
        let remote_qpn = c.remote.as_ref().map_or(0, |r| r.qpn);
        match state {
            State::Established | State::RepSent => {
                let tid2 = self.alloc_tid(conn.0);
                let dreq = CmMad {
                    tid: tid2,
                    msg: CmMessage::Dreq(Dreq {
                        local_comm_id: conn.0,
                        remote_comm_id: remote_id,
                        remote_qpn,
                        private_data: Vec::new(),
                    }),
                };
                let bytes = self.send(peer, &dreq);
                let (timeout, retries) = (self.cfg.response_timeout, self.cfg.max_retries);
                if let Some(c) = self.conns.get_mut(&conn.0) {
                    c.state = State::DreqSent;
                    c.last_sent = bytes;
                    c.deadline = Some(now + timeout);
                    c.retries_left = retries;
                }
            }
            State::DreqSent => {}
            State::ReqRcvd | State::ReqSent => {
                self.conns.remove(&conn.0);
                let msg = if state == State::ReqRcvd {
                    MSG_REQ
                } else {
                    MSG_OTHER
                };
                self.send_rej(
                    peer,
                    tid,
                    conn.0,
                    remote_id,
                    msg,
                    reject_reason::CONSUMER_DEFINED,
                );
            }
        }
        Ok(())
    }

    /// Runs expired timers: resends, or fails the connection after
    /// `max_retries` (REJ with `TIMEOUT` to the peer during setup).
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
            .map(|(&id, _)| id)
            .collect();
        for id in due {
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            if c.retries_left > 0 && c.state != State::ReqRcvd {
                c.retries_left -= 1;
                c.deadline = Some(now + self.cfg.response_timeout);
                let (peer, bytes) = (c.peer, c.last_sent);
                if let Some(b) = bytes {
                    self.counters.retransmits += 1;
                    self.send_bytes(peer, b);
                }
                continue;
            }
            let Some(c) = self.conns.remove(&id) else {
                continue;
            };
            self.counters.timeouts += 1;
            match c.state {
                State::DreqSent => {
                    self.push_event(CmEvent::Disconnected { conn: ConnId(id) });
                }
                State::Established => {}
                State::ReqRcvd | State::RepSent | State::ReqSent => {
                    let msg = if c.passive { MSG_REP } else { MSG_REQ };
                    let msg = if c.state == State::ReqRcvd {
                        MSG_REQ
                    } else {
                        msg
                    };
                    self.send_rej(
                        c.peer,
                        c.tid,
                        id,
                        c.remote_comm_id,
                        msg,
                        reject_reason::TIMEOUT,
                    );
                    self.push_event(CmEvent::Failed {
                        conn: ConnId(id),
                        failure: CmFailure::Timeout,
                    });
                }
            }
        }
    }
}
