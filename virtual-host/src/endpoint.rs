//! One rdma_cm connection as the rping/ucmatose services see it, over
//! either transport:
//!
//! * iWARP: an [`IwarpEndpoint`] (siw engine on a smoltcp TCP socket, MPA
//!   setup);
//! * RoCE: a roce-model RC QP of the host's [`RdmaDevice`], set up by the IB
//!   CM on the GSI QP (REQ/REP/RTU, DREQ/DREP), as rxe guests do it.
//!
//! The services use siw's work-request and completion types for both; the
//! RoCE side translates them to roce-model's.

use crate::iwarp::IwarpEndpoint;
use crate::{HostError, RdmaDevice};
use ib_cm::{
    ipv4_mapped_gid, service_id, CmEvent, CmaHeader, ConnId, ConnectParams, LocalQp, RemoteQp,
    RDMA_PS_TCP,
};
use roce_model::{Mtu, QpAttr, QpCaps, RecvWr, SendOp, SendWr};
use siw::{Access, Completion, ConnError, Sge, WcOpcode, WcStatus, WorkRequest};
use smoltcp::iface::{SocketHandle, SocketSet};
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

/// Which transport a service's connections use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// iWARP (siw guests): TCP + MPA.
    Iwarp,
    /// RoCEv2 (rxe guests): IB CM MADs on QP1 + an RC QP.
    Roce,
}

/// Why an [`Endpoint`] refused a registration, a post or a local memory
/// write. The services put the text in their session errors, after what
/// they were doing (`post receive: ...`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum EndpointError {
    /// An atomic on an iWARP connection: RDMAP has none.
    #[error("iWARP has no atomics")]
    NoAtomics,
    /// The RoCE side: the host's RDMA device refused.
    #[error(transparent)]
    Rdma(#[from] HostError),
    /// The iWARP side: the siw engine refused the work request.
    #[error(transparent)]
    Post(#[from] siw::PostError),
    /// The iWARP side: the siw memory refused the write (siw's error has
    /// no text of its own, so its name is the message).
    #[error("{0:?}")]
    Access(siw::AccessError),
}

/// What a connection reports.
#[derive(Debug)]
pub(crate) enum EpEvent {
    /// iWARP responder: the MPA Request arrived (accept it).
    ConnectRequest,
    /// The connection is up.
    Connected {
        /// MPA CRC in use (iWARP).
        crc: bool,
        /// Our QPN and the peer's (RoCE; 0 for iWARP).
        qpns: (u32, u32),
    },
    /// The peer refused (MPA reject, CM REJ) or the CM gave up.
    Rejected(String),
    /// A work completion (siw's types for both transports).
    Completion(Completion),
    /// An iWARP connection error.
    Iwarp(ConnError),
    /// The connection ended.
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RoceState {
    /// REQ sent (active) or REP sent (passive), waiting for the peer.
    Setup,
    Connected,
    /// DREQ sent.
    Closing,
    Closed,
}

/// An RC QP connected through the IB CM.
pub(crate) struct RoceEndpoint {
    conn: ConnId,
    qpn: u32,
    psn: u32,
    passive: bool,
    state: RoceState,
    mrs: Vec<u32>,
    pending: VecDeque<EpEvent>,
    /// Reads/atomics we may have outstanding and accept (asked for).
    rd_atomic: u8,
    /// The QP's ACK timeout (IB encoding).
    ack_timeout: u8,
}

/// Maps a CM path MTU code to roce-model's, at most 4096.
fn mtu_of(code: u8) -> Mtu {
    Mtu::from_code(code).unwrap_or(Mtu::Mtu1024)
}

/// roce-model's ACK timeout (14: 67 ms), which rping and ucmatose keep.
pub(crate) const DEFAULT_ACK_TIMEOUT: u8 = 14;
/// Linux rdma_cm over RoCE: packet lifetime 16 (`CMA_IBOE_PACKET_LIFETIME`),
/// so an ACK timeout of 17–18 (0.5–1 s). perftest `-R` needs it: 67 ms is
/// shorter than a TCG guest's rxe takes to answer 16 READs, and the resent
/// READ requests then kept it replaying (guest run, `ib_read_bw -R` as
/// server, 1000 × 4 KiB: 450 000 duplicate requests, stalled).
pub(crate) const RDMA_CM_ACK_TIMEOUT: u8 = 18;

fn qp_attr(local_psn: u32, remote: &RemoteQp, rd_atomic: u8, timeout: u8) -> QpAttr {
    QpAttr {
        pmtu: mtu_of(remote.path_mtu),
        // A CM message's starting PSN is the PSN its sender expects to
        // receive (Linux: the REQ's becomes the active side's rq_psn and
        // the passive side's sq_psn); seen on the wire with rxe.
        sq_psn: remote.starting_psn,
        rq_psn: local_psn,
        dest_qpn: remote.qpn,
        // rdma_cm's defaults: retry 7 (rxe: infinite), RNR retry 7.
        retry_cnt: remote.retry_count.min(7),
        rnr_retry: 7,
        max_rd_atomic: remote.responder_resources.clamp(1, rd_atomic.max(1)),
        max_dest_rd_atomic: rd_atomic.max(1),
        timeout,
        ..QpAttr::default()
    }
}

impl RoceEndpoint {
    /// Passive side: a QP for the peer's REQ, moved to RTS, and the REP.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn accept(
        rdma: &mut RdmaDevice,
        conn: ConnId,
        peer: Ipv4Addr,
        remote: &RemoteQp,
        caps: QpCaps,
        rd_atomic: u8,
        psn: u32,
        ack_timeout: u8,
        now: Instant,
    ) -> Result<Self, HostError> {
        let qpn = rdma.create_qp(peer, caps)?;
        let psn = psn & 0xff_ffff;
        let setup = rdma
            .connect_qp(qpn, &qp_attr(psn, remote, rd_atomic, ack_timeout))
            .and_then(|_| {
                rdma.cm_accept(
                    conn,
                    LocalQp {
                        qpn,
                        starting_psn: psn,
                        responder_resources: rd_atomic,
                        initiator_depth: rd_atomic,
                        rnr_retry_count: 7,
                        // rping and ucmatose accept without private data.
                        private_data: Vec::new(),
                    },
                    now,
                )
            });
        if let Err(e) = setup {
            rdma.destroy_qp(qpn);
            rdma.cm_reject(conn, ib_cm::reject_reason::NO_QP);
            return Err(e);
        }
        Ok(Self {
            conn,
            qpn,
            psn,
            passive: true,
            state: RoceState::Setup,
            mrs: Vec::new(),
            pending: VecDeque::new(),
            rd_atomic,
            ack_timeout,
        })
    }

    /// Active side: a QP in INIT and the REQ to `peer`'s rdma_cm `port`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn connect(
        rdma: &mut RdmaDevice,
        owner: u32,
        peer: Ipv4Addr,
        port: u16,
        src_port: u16,
        caps: QpCaps,
        rd_atomic: u8,
        psn: u32,
        mtu: u32,
        ack_timeout: u8,
        now: Instant,
    ) -> Result<Self, HostError> {
        let qpn = rdma.create_qp(peer, caps)?;
        let psn = psn & 0xff_ffff;
        let cma = CmaHeader {
            src: IpAddr::V4(rdma.ip()),
            src_port,
            dst: IpAddr::V4(peer),
        };
        let pd = cma
            .to_private_data(&[])
            .map_err(|e| HostError::Invalid(e.to_string()))?;
        let path_mtu = match mtu {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            2048 => Mtu::Mtu2048,
            4096 => Mtu::Mtu4096,
            _ => Mtu::Mtu1024,
        } as u8;
        let params = ConnectParams {
            service_id: service_id(RDMA_PS_TCP, port),
            local: LocalQp {
                qpn,
                starting_psn: psn,
                responder_resources: rd_atomic,
                initiator_depth: rd_atomic,
                rnr_retry_count: 7,
                private_data: pd,
            },
            path_mtu,
            retry_count: 7,
            local_gid: ipv4_mapped_gid(rdma.ip().octets()),
            remote_gid: ipv4_mapped_gid(peer.octets()),
        };
        match rdma.cm_connect(peer, params, owner, qpn, now) {
            Ok(conn) => Ok(Self {
                conn,
                qpn,
                psn,
                passive: false,
                state: RoceState::Setup,
                mrs: Vec::new(),
                pending: VecDeque::new(),
                rd_atomic,
                ack_timeout,
            }),
            Err(e) => {
                rdma.destroy_qp(qpn);
                Err(e)
            }
        }
    }

    /// Our QP.
    pub(crate) fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The CM connection.
    pub(crate) fn conn(&self) -> ConnId {
        self.conn
    }

    /// A CM event for this connection.
    pub(crate) fn on_cm(&mut self, rdma: &mut RdmaDevice, e: CmEvent) {
        match e {
            CmEvent::Established { remote, .. } if self.state == RoceState::Setup => {
                if !self.passive {
                    let attr = qp_attr(self.psn, &remote, self.rd_atomic, self.ack_timeout);
                    if let Err(err) = rdma.connect_qp(self.qpn, &attr) {
                        self.pending
                            .push_back(EpEvent::Rejected(format!("QP to RTS: {err}")));
                        return;
                    }
                }
                self.state = RoceState::Connected;
                self.pending.push_back(EpEvent::Connected {
                    crc: false,
                    qpns: (self.qpn, remote.qpn),
                });
            }
            CmEvent::Rejected { reason, .. } => {
                self.state = RoceState::Closed;
                self.pending
                    .push_back(EpEvent::Rejected(format!("CM REJ, reason {reason}")));
                self.pending.push_back(EpEvent::Closed);
            }
            CmEvent::Failed { failure, .. } => {
                self.state = RoceState::Closed;
                self.pending
                    .push_back(EpEvent::Rejected(format!("CM setup failed: {failure:?}")));
                self.pending.push_back(EpEvent::Closed);
            }
            CmEvent::Disconnected { .. } => {
                self.state = RoceState::Closed;
                self.pending.push_back(EpEvent::Closed);
            }
            _ => {}
        }
    }

    fn close(&mut self, rdma: &mut RdmaDevice, now: Instant) {
        match self.state {
            RoceState::Connected => {
                self.state = RoceState::Closing;
                rdma.cm_disconnect(self.conn, now);
            }
            RoceState::Setup => {
                rdma.cm_disconnect(self.conn, now);
                self.state = RoceState::Closed;
                self.pending.push_back(EpEvent::Closed);
            }
            RoceState::Closing | RoceState::Closed => {}
        }
    }

    /// Completions of the QP, translated to siw's types.
    fn poll(&mut self, rdma: &mut RdmaDevice) -> bool {
        let mut any = false;
        while let Some(c) = rdma.poll_completion(self.qpn) {
            any = true;
            let opcode = match c.opcode {
                roce_model::WcOpcode::Send => WcOpcode::Send,
                roce_model::WcOpcode::RdmaWrite => WcOpcode::Write,
                // siw's types have no atomics (iWARP has none): an atomic
                // completes like a READ, its old value in the local buffer
                roce_model::WcOpcode::RdmaRead
                | roce_model::WcOpcode::FetchAdd
                | roce_model::WcOpcode::CompSwap => WcOpcode::Read,
                _ => WcOpcode::Recv,
            };
            let status = match c.status {
                roce_model::WcStatus::Success => WcStatus::Success,
                roce_model::WcStatus::WrFlushErr => WcStatus::Flushed,
                roce_model::WcStatus::LocLenErr => WcStatus::LocalLength,
                roce_model::WcStatus::LocProtErr => WcStatus::LocalProtection,
                _ => WcStatus::Fatal,
            };
            self.pending.push_back(EpEvent::Completion(Completion {
                wr_id: c.wr_id,
                opcode,
                status,
                byte_len: c.byte_len,
                solicited: false,
                invalidated: None,
            }));
        }
        any
    }

    fn release(&mut self, rdma: &mut RdmaDevice, now: Instant) {
        for k in self.mrs.drain(..) {
            rdma.deregister_mr(k);
        }
        rdma.retire_qp(self.qpn, now);
        if self.state != RoceState::Closed {
            rdma.cm_disconnect(self.conn, now);
            self.state = RoceState::Closed;
        }
    }
}

fn roce_access(a: Access) -> roce_model::Access {
    let mut r = roce_model::Access::NONE;
    if a.contains(Access::LOCAL_WRITE) {
        r |= roce_model::Access::LOCAL_WRITE;
    }
    if a.contains(Access::REMOTE_WRITE) {
        r |= roce_model::Access::REMOTE_WRITE | roce_model::Access::LOCAL_WRITE;
    }
    if a.contains(Access::REMOTE_READ) {
        r |= roce_model::Access::REMOTE_READ;
    }
    r
}

/// A connection over either transport.
pub(crate) enum Endpoint {
    /// iWARP (boxed: the siw engine is large).
    Iwarp(Box<IwarpEndpoint>),
    /// RoCE.
    Roce(RoceEndpoint),
}

impl Endpoint {
    /// Registers `len` zeroed bytes at `va`; returns the key (STag / lkey = rkey).
    pub(crate) fn register(
        &mut self,
        rdma: &mut RdmaDevice,
        len: usize,
        va: u64,
        access: Access,
    ) -> Result<u32, EndpointError> {
        match self {
            Endpoint::Iwarp(ep) => Ok(ep.conn().mem_mut().register(vec![0; len], va, access)),
            Endpoint::Roce(r) => {
                let k = rdma.register_mr_at(va, len, roce_access(access))?;
                r.mrs.push(k);
                Ok(k)
            }
        }
    }

    /// Registers a RoCE buffer that the peer may run atomics on (iWARP has
    /// no atomics).
    pub(crate) fn register_atomic_target(
        &mut self,
        rdma: &mut RdmaDevice,
        len: usize,
        va: u64,
    ) -> Result<u32, EndpointError> {
        match self {
            Endpoint::Iwarp(_) => Err(EndpointError::NoAtomics),
            Endpoint::Roce(r) => {
                let k = rdma.register_mr_at(
                    va,
                    len,
                    roce_model::Access::LOCAL_WRITE
                        | roce_model::Access::REMOTE_READ
                        | roce_model::Access::REMOTE_ATOMIC,
                )?;
                r.mrs.push(k);
                Ok(k)
            }
        }
    }

    /// Posts an 8-byte ATOMIC FETCH AND ADD of `add` at the peer's
    /// `remote_addr`, the old value landing in `local` (RoCE only).
    pub(crate) fn post_fetch_add(
        &mut self,
        rdma: &mut RdmaDevice,
        wr_id: u64,
        local: Sge,
        remote_stag: u32,
        remote_addr: u64,
        add: u64,
    ) -> Result<(), EndpointError> {
        match self {
            Endpoint::Iwarp(_) => Err(EndpointError::NoAtomics),
            Endpoint::Roce(r) => Ok(rdma.post_send(
                r.qpn,
                SendWr::new(
                    wr_id,
                    SendOp::AtomicFetchAndAdd {
                        remote_addr,
                        rkey: remote_stag,
                        add,
                    },
                    vec![roce_model::Sge::new(local.addr, local.len, local.stag)],
                ),
            )?),
        }
    }

    /// Writes local memory.
    pub(crate) fn mem_write(
        &mut self,
        rdma: &mut RdmaDevice,
        key: u32,
        va: u64,
        data: &[u8],
    ) -> Result<(), EndpointError> {
        match self {
            Endpoint::Iwarp(ep) => ep
                .conn()
                .mem_mut()
                .write(key, va, data, Access::NONE)
                .map_err(EndpointError::Access),
            Endpoint::Roce(_) => Ok(rdma.write(key, va, data)?),
        }
    }

    /// Reads local memory.
    pub(crate) fn mem_read(
        &mut self,
        rdma: &mut RdmaDevice,
        key: u32,
        va: u64,
        len: usize,
    ) -> Option<Vec<u8>> {
        match self {
            Endpoint::Iwarp(ep) => ep
                .conn()
                .mem()
                .read(key, va, len, Access::NONE)
                .ok()
                .map(|d| d.to_vec()),
            Endpoint::Roce(_) => rdma.read(key, va, len).ok(),
        }
    }

    /// Posts a SEND / READ / WRITE.
    pub(crate) fn post_send(
        &mut self,
        rdma: &mut RdmaDevice,
        wr_id: u64,
        wr: WorkRequest,
    ) -> Result<(), EndpointError> {
        match self {
            Endpoint::Iwarp(ep) => Ok(ep.conn().post_send(wr_id, wr)?),
            Endpoint::Roce(r) => {
                let sge = |s: Sge| roce_model::Sge::new(s.addr, s.len, s.stag);
                let (op, local) = match wr {
                    WorkRequest::Send { local, .. } => (SendOp::Send, local),
                    WorkRequest::Read {
                        local,
                        remote_stag,
                        remote_addr,
                    } => (
                        SendOp::RdmaRead {
                            remote_addr,
                            rkey: remote_stag,
                        },
                        local,
                    ),
                    WorkRequest::Write {
                        local,
                        remote_stag,
                        remote_addr,
                    } => (
                        SendOp::RdmaWrite {
                            remote_addr,
                            rkey: remote_stag,
                        },
                        local,
                    ),
                };
                Ok(rdma.post_send(r.qpn, SendWr::new(wr_id, op, vec![sge(local)]))?)
            }
        }
    }

    /// Posts a receive.
    pub(crate) fn post_recv(
        &mut self,
        rdma: &mut RdmaDevice,
        wr_id: u64,
        sge: Sge,
    ) -> Result<(), EndpointError> {
        match self {
            Endpoint::Iwarp(ep) => Ok(ep.conn().post_recv(wr_id, sge)?),
            Endpoint::Roce(r) => Ok(rdma.post_recv(
                r.qpn,
                RecvWr::new(
                    wr_id,
                    vec![roce_model::Sge::new(sge.addr, sge.len, sge.stag)],
                ),
            )?),
        }
    }

    /// Graceful close (iWARP: MPA/TCP close; RoCE: DREQ).
    pub(crate) fn close(&mut self, rdma: &mut RdmaDevice, now: Instant) {
        match self {
            Endpoint::Iwarp(ep) => ep.conn().close(),
            Endpoint::Roce(r) => r.close(rdma, now),
        }
    }

    /// Accepts an iWARP connection request (RoCE connections are accepted
    /// when they are created).
    pub(crate) fn accept(&mut self) -> Result<(), EndpointError> {
        match self {
            Endpoint::Iwarp(ep) => Ok(ep.conn().accept(&[])?),
            Endpoint::Roce(_) => Ok(()),
        }
    }

    /// Moves bytes / completions; returns whether anything moved.
    pub(crate) fn pump(&mut self, sockets: &mut SocketSet<'static>, rdma: &mut RdmaDevice) -> bool {
        match self {
            Endpoint::Iwarp(ep) => ep.pump(sockets),
            Endpoint::Roce(r) => r.poll(rdma),
        }
    }

    /// The next event.
    pub(crate) fn poll_event(&mut self) -> Option<EpEvent> {
        match self {
            Endpoint::Iwarp(ep) => Some(match ep.conn().poll_event()? {
                siw::Event::ConnectRequest { .. } => EpEvent::ConnectRequest,
                siw::Event::Connected { negotiated, .. } => EpEvent::Connected {
                    crc: negotiated.crc,
                    qpns: (0, 0),
                },
                siw::Event::Rejected { .. } => {
                    EpEvent::Rejected("the peer rejected the connection".into())
                }
                siw::Event::Completion(c) => EpEvent::Completion(c),
                siw::Event::Error(e) => EpEvent::Iwarp(e),
                siw::Event::Closed => EpEvent::Closed,
            }),
            Endpoint::Roce(r) => r.pending.pop_front(),
        }
    }

    /// Runs the endpoint's own timers (iWARP setup timeout).
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if let Endpoint::Iwarp(ep) = self {
            ep.handle_timeout(now);
        }
    }

    /// The endpoint's own timer.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Endpoint::Iwarp(ep) => ep.poll_timeout(),
            Endpoint::Roce(_) => None,
        }
    }

    /// Whether the connection is over and its last bytes are out.
    pub(crate) fn is_finished(&self) -> bool {
        match self {
            Endpoint::Iwarp(ep) => ep.is_finished(),
            Endpoint::Roce(r) => r.state == RoceState::Closed && r.pending.is_empty(),
        }
    }

    /// Frees what the connection holds on the device (RoCE: MRs, the QP
    /// once its last ACKs are out, the CM connection).
    pub(crate) fn release(&mut self, rdma: &mut RdmaDevice, now: Instant) {
        if let Endpoint::Roce(r) = self {
            r.release(rdma, now);
        }
    }

    /// The TCP socket (iWARP).
    pub(crate) fn socket(&self) -> Option<SocketHandle> {
        match self {
            Endpoint::Iwarp(ep) => Some(ep.socket()),
            Endpoint::Roce(_) => None,
        }
    }

    /// Messages the peer placed with us that leave no completion: WRITEs
    /// (`reads == false`) or READ requests answered. RoCE counts every
    /// message the QP's responder completed (its MSN), which is the same
    /// on a QP that sees only the one kind.
    pub(crate) fn peer_messages(&self, rdma: &RdmaDevice, reads: bool) -> u64 {
        match self {
            Endpoint::Iwarp(ep) => {
                let o = ep.peer_ops();
                if reads {
                    o.read_requests
                } else {
                    o.writes
                }
            }
            Endpoint::Roce(r) => rdma.qp_stats(r.qpn).map_or(0, |s| s.messages_received),
        }
    }

    /// The RoCE endpoint, if this is one.
    pub(crate) fn roce(&mut self) -> Option<&mut RoceEndpoint> {
        match self {
            Endpoint::Roce(r) => Some(r),
            Endpoint::Iwarp(_) => None,
        }
    }
}
