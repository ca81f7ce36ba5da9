//! perftest with `-R` (rdma_cm): `ib_write_bw`, `ib_send_bw` and
//! `ib_read_bw`, server and client, over iWARP (the `siw` engine) or RoCE
//! (RC QPs set up by the IB CM), both through [`Endpoint`].
//!
//! With `-R` perftest 6.24 uses no TCP side channel. It makes two rdma_cm
//! connections to the same port: over iWARP two TCP connections with an MPA
//! exchange each (no private data, no CMA header), over RoCE two IB CM
//! connections (REQ/REP/RTU on QP1, rdma_cm's header as private data):
//!
//! 1. the **control** connection (`establish_connection`): an RC QP with one
//!    receive of 56 bytes posted at a time; every exchange item is a SEND of
//!    the item's size, the client first, the server answering (strict
//!    alternation, so one receive is enough). Both sides sleep 1 s after it
//!    is up.
//! 2. the **data** connection (`create_rdma_cm_connection`), made after the
//!    first key exchange on the control connection; the client connects
//!    again, the server listens again. The test runs on its QP.
//!
//! The items (sizes in bytes; keys are `struct pingpong_dest`, 56 bytes,
//! fields big-endian: lid, out_reads, qpn, psn, rkey, 4 bytes padding, vaddr
//! (8), GID (16), srqn, gid_index):
//!
//! | # | write/read | send |
//! |---|---|---|
//! | 0–3 | version 16, cycle buffer 4, cache line 4, MTU text 2 | same |
//! | 4 | keys (zeroed: before the data connection) | same |
//! | – | data connection | same |
//! | 5 | keys (after it) | same |
//! | 6–8 | keys (set up, print, after RTR) | keys 6–9 (set up, again, print, receives posted) |
//! | – | the client's WRITEs/READs | the client's SENDs |
//! | 9 | keys (client done) | 10: keys (close) |
//! | 10–14 | reports: size, iterations, peak, average, message rate (8 each) | – |
//! | 15 | keys (close) | – |
//!
//! Then the server disconnects the data connection (`rdma_disconnect`) and
//! both wait for it to go; the control connection goes when the tools exit.
//!
//! iWARP has no RNR retry, so `ib_send_bw` over iWARP (only) uses credits: each
//! side's keys from item 6 on carry a 4-byte credit buffer (rkey, vaddr)
//! instead of the data buffer; the server RDMA WRITEs its count of completed
//! receives (little-endian `u32`, host order on x86) there every
//! `rx_depth / 3` receives, and the client keeps `sent - credit` below its
//! `rx_depth` (clamped to the iterations).
//!
//! What the host counts (`last_iterations`): the server the WRITE messages
//! placed, the READ requests answered or the receives completed on the data
//! connection; the client its completed operations. The tools do not check
//! data, so neither do we.

use crate::endpoint::{Endpoint, EndpointError, EpEvent, RoceEndpoint, TransportKind};
use crate::iwarp::{engine_config, IwarpCounters, IwarpEndpoint};
use crate::perftest::{check_peer_version, opening_item, OldPeerVersion, Verb, CYCLE_BUFFER};
use crate::pingpong::gid_of;
use crate::rdma::{dispatch_cm, CmRequest, CmService};
use crate::spec::{
    abort_sockets, accepted_peer, client_target, drain_and_close, roce_connect, session_started,
    tcp_connect, tcp_listen, ServiceSpec, SessionTally,
};
use crate::{HostError, RdmaDevice, ServiceCtx, ServiceStatus};
use ib_cm::{CmEvent, ConnId};
use roce_model::QpCaps;
use siw::{Access, Completion, Sge, WcOpcode, WcStatus, WorkRequest};
use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::socket::tcp::{Socket, State};
use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// Size of `struct pingpong_dest` on x86-64.
pub const DEST_LEN: usize = 56;
/// Items of `ib_write_bw -R` / `ib_read_bw -R` (see the module docs).
const WRITE_SCRIPT: [usize; 16] = [
    16, 4, 4, 2, DEST_LEN, DEST_LEN, DEST_LEN, DEST_LEN, DEST_LEN, DEST_LEN, 8, 8, 8, 8, 8,
    DEST_LEN,
];
/// Items of `ib_send_bw -R`.
const SEND_SCRIPT: [usize; 11] = [
    16, 4, 4, 2, DEST_LEN, DEST_LEN, DEST_LEN, DEST_LEN, DEST_LEN, DEST_LEN, DEST_LEN,
];
/// The item the client sends only once the data connection is up.
const FIRST_DATA_ITEM: usize = 5;
/// From this item on, the keys are the side's real ones.
const REAL_KEYS_ITEM: usize = 6;
/// A session without progress for this long fails.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// The tools sleep 1 s once the control connection is up; our client does
/// the same before its first item (this also keeps it clear of Linux siw's
/// accept race, see `rping::FIRST_SEND_DELAY`).
const CONTROL_SETTLE: Duration = Duration::from_secs(1);
/// Client retry interval while the tool's server is not up.
const RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// The tool's server listens for the data connection only after answering
/// item 4; our client retries that connection this often, this long.
const DATA_RETRY_INTERVAL: Duration = Duration::from_millis(200);
const DATA_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a finished session waits for the peer to close its side.
const CLOSE_WAIT: Duration = Duration::from_secs(30);
/// Server: how long the data connection may be silent before we close it
/// with fewer WRITEs placed than the client reported.
const DATA_QUIET: Duration = Duration::from_secs(20);
/// How long a closed socket may take to get its last bytes out.
const LINGER: Duration = Duration::from_secs(2);
/// Operations in flight (WRITE/SEND); READs are limited by the ORD.
const DEPTH: u32 = 64;
const READ_DEPTH: u32 = 16;
/// TCP buffers of our sockets (each way): 4 KiB windows make a bulk
/// transfer crawl.
const TCP_BUFFER: usize = 16 * 1024;
/// IRD/ORD we offer: Linux siw's maximum (the tool's READ client asks for
/// its device maximum).
const IRD_ORD: u16 = 128;

const CTL_RECV_VA: u64 = 0x7f50_0000_0000;
const CTL_SEND_VA: u64 = 0x7f51_0000_0000;
const DATA_VA: u64 = 0x7f60_0000_0000;
const CREDIT_VA: u64 = 0x7f61_0000_0000;
const CREDIT_SRC_VA: u64 = 0x7f62_0000_0000;

const WR_CTL_RECV: u64 = 1;
const WR_CTL_SEND: u64 = 2;
const WR_DATA_RECV: u64 = 3;
const WR_OP: u64 = 4;
const WR_CREDIT: u64 = 5;

/// perftest's `struct pingpong_dest` (the fields rdma_cm mode uses).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dest {
    /// LID (0 on Ethernet).
    pub lid: u32,
    /// Outstanding reads.
    pub out_reads: u32,
    /// QP number.
    pub qpn: u32,
    /// PSN.
    pub psn: u32,
    /// rkey (STag) of the buffer the peer should use.
    pub rkey: u32,
    /// Its address.
    pub vaddr: u64,
    /// GID.
    pub gid: [u8; 16],
    /// SRQ number.
    pub srqn: u32,
    /// GID index.
    pub gid_index: u32,
}

impl Dest {
    /// Wire form: the struct with its fields big-endian (perftest's
    /// `rdma_write_keys`).
    pub fn encode(&self) -> [u8; DEST_LEN] {
        let mut b = [0u8; DEST_LEN];
        b[0..4].copy_from_slice(&self.lid.to_be_bytes());
        b[4..8].copy_from_slice(&self.out_reads.to_be_bytes());
        b[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        b[12..16].copy_from_slice(&self.psn.to_be_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        b[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        b[32..48].copy_from_slice(&self.gid);
        b[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        b[52..56].copy_from_slice(&self.gid_index.to_be_bytes());
        b
    }

    /// Parses the wire form (exactly [`DEST_LEN`] bytes).
    pub fn decode(b: &[u8]) -> Option<Dest> {
        let b: &[u8; DEST_LEN] = b.try_into().ok()?;
        let u32_at = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[32..48]);
        let mut va = [0u8; 8];
        va.copy_from_slice(&b[24..32]);
        Some(Dest {
            lid: u32_at(0),
            out_reads: u32_at(4),
            qpn: u32_at(8),
            psn: u32_at(12),
            rkey: u32_at(16),
            vaddr: u64::from_be_bytes(va),
            gid,
            srqn: u32_at(48),
            gid_index: u32_at(52),
        })
    }
}

/// Which side we play.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The tool's server (`ib_write_bw -R`): we listen.
    Server,
    /// The tool's client (`ib_write_bw -R HOST`): we connect.
    Client,
}

/// Why a perftest `-R` session failed on our side: a buffer, a post, a
/// completion or an exchange item the tool would not have produced. The
/// session keeps the first one's text as its error (`last_error`, the
/// `SessionFailed` event).
#[derive(Debug, thiserror::Error)]
pub(crate) enum PerftestCmError {
    /// Registering the control connection's buffers.
    #[error("control buffers: {0}")]
    ControlBuffers(EndpointError),
    /// Registering the data connection's buffers.
    #[error("data buffer: {0}")]
    DataBuffer(EndpointError),
    /// Writing a control message into its buffer.
    #[error("control buffer: {0}")]
    ControlBuffer(EndpointError),
    /// A control receive completed but its buffer cannot be read.
    #[error("control buffer unreadable")]
    ControlBufferUnreadable,
    /// Writing our receive count into the credit buffer.
    #[error("credit buffer: {0}")]
    CreditBuffer(EndpointError),
    /// Posting the control receive.
    #[error("post control receive: {0}")]
    PostControlReceive(EndpointError),
    /// Posting a control SEND.
    #[error("post control send: {0}")]
    PostControlSend(EndpointError),
    /// Posting a data receive (SEND server).
    #[error("post receive: {0}")]
    PostReceive(EndpointError),
    /// Posting a credit WRITE (SEND server over iWARP).
    #[error("post credit: {0}")]
    PostCredit(EndpointError),
    /// Posting the client's operation number `n`.
    #[error("post operation {n}: {error}")]
    PostOperation {
        /// Operations posted before it.
        n: u32,
        /// The endpoint's refusal.
        error: EndpointError,
    },
    /// A control completion with an error status.
    #[error("control {opcode:?} completion: {status:?}")]
    ControlCompletion {
        /// The work completion's opcode.
        opcode: WcOpcode,
        /// Its status.
        status: WcStatus,
    },
    /// A control completion of an opcode we never post.
    #[error("unexpected control {0:?} completion")]
    UnexpectedControlCompletion(WcOpcode),
    /// A data completion with an error status.
    #[error("{opcode:?} completion: {status:?}")]
    DataCompletion {
        /// The work completion's opcode.
        opcode: WcOpcode,
        /// Its status.
        status: WcStatus,
    },
    /// A data completion this role does not expect.
    #[error("unexpected {0:?} completion")]
    UnexpectedDataCompletion(WcOpcode),
    /// SEND server: a SEND longer than the test's size.
    #[error("SEND of {0} bytes")]
    SendTooLong(u32),
    /// Something needs the data connection before it exists.
    #[error("no data connection")]
    NoDataConnection,
    /// Client: the operations are due but the server's keys never came.
    #[error("no keys from the server")]
    NoKeys,
    /// The peer's part of an item has the wrong size.
    #[error("item {item}: {got} bytes, expected {want}")]
    ItemSize {
        /// The item.
        item: usize,
        /// Its size.
        got: usize,
        /// The size the script says.
        want: usize,
    },
    /// The peer's perftest is older than the exchange we speak.
    #[error(transparent)]
    Version(#[from] OldPeerVersion),
    /// The peer's keys do not decode.
    #[error("bad keys")]
    BadKeys,
    /// Server: a control message after the script's end.
    #[error("control message after the last item")]
    AfterLastItem,
    /// Server: the client sent an item that needs the data connection
    /// before it connected it.
    #[error("item {0} before the data connection")]
    BeforeDataConnection(usize),
    /// Client: the data connection's socket or its connect.
    #[error(transparent)]
    Host(#[from] HostError),
}

/// One connection of a session (iWARP or RoCE) with its registered
/// buffers.
struct Conn {
    ep: Endpoint,
    connected: bool,
    /// The peer's WRITEs placed / READ requests answered (see
    /// [`Endpoint::peer_messages`]), updated as the connection moves.
    peer_msgs: u64,
    /// RoCE client: the peer refused this connection before it was up
    /// (nobody listens yet); connect again.
    refused: bool,
    closed: bool,
    /// Not before this may we send (settle time after setup).
    ready_at: Option<Instant>,
    /// Control: receive and send buffers. Data: data buffer and credit
    /// buffer (client: credits arrive there; server: the source of ours).
    stag_a: u32,
    stag_b: u32,
}

impl Conn {
    /// A connection on `ep`, not up yet, with its two buffers.
    fn new(ep: Endpoint, stag_a: u32, stag_b: u32) -> Self {
        Conn {
            ep,
            connected: false,
            peer_msgs: 0,
            refused: false,
            closed: false,
            ready_at: None,
            stag_a,
            stag_b,
        }
    }

    fn ready(&self, now: Instant) -> bool {
        self.connected && !self.closed && self.ready_at.is_none_or(|t| now >= t)
    }
}

struct Session {
    peer: Ipv4Addr,
    ctl: Conn,
    data: Option<Conn>,
    /// Client: the data connection's socket while it connects.
    data_sock: Option<SocketHandle>,
    data_retry_at: Option<Instant>,
    data_deadline: Option<Instant>,
    /// Control messages received, not yet handled.
    inbox: VecDeque<Vec<u8>>,
    step: usize,
    /// Client: our part of `step` is posted.
    sent: bool,
    keys: Dest,
    remote: Option<Dest>,
    /// Client: operations posted and completed; server: receives (SEND).
    posted: u32,
    completed: u32,
    /// Server SEND test: receives completed, last credit sent.
    received: u32,
    credited: u32,
    run_started: Option<Instant>,
    run_elapsed: Duration,
    started: Instant,
    last_progress: Instant,
    /// All items exchanged: waiting for the connections to close.
    items_done: Option<Instant>,
    /// Server: we closed the data connection.
    data_closing: bool,
    /// The iterations the client reported (item 11, WRITE/READ).
    their_iters: Option<u64>,
    error: Option<String>,
}

/// The perftest `-R` service (both roles, the three verbs).
pub struct PerftestCm {
    id: u32,
    verb: Verb,
    role: Role,
    transport: TransportKind,
    spec: ServiceSpec,
    /// iWARP server: the socket listening for the next connection. Client: the
    /// control connection's socket before it is up.
    sock: Option<SocketHandle>,
    retry_at: Option<Instant>,
    connect_deadline: Instant,
    done: bool,
    session: Option<Session>,
    /// Sockets of ended sessions, closing (removed when closed or after
    /// [`LINGER`]).
    closing: Vec<(SocketHandle, Instant)>,
    tally: SessionTally,
    counters: IwarpCounters,
}

impl PerftestCm {
    pub(crate) fn start(
        id: u32,
        verb: Verb,
        role: Role,
        spec: ServiceSpec,
        ctx: &mut ServiceCtx<'_>,
    ) -> Result<Self, HostError> {
        if verb == Verb::Atomic && !spec.roce {
            return Err(HostError::Invalid(
                "ib_atomic_bw -R over iWARP: not supported (iWARP has no atomics; use roce = true / --roce)"
                    .into(),
            ));
        }
        let transport = if spec.roce {
            TransportKind::Roce
        } else {
            TransportKind::Iwarp
        };
        if transport == TransportKind::Roce {
            let mut p = PerftestCm::new(id, verb, role, transport, spec, None, ctx.now);
            match role {
                Role::Server => ctx
                    .rdma
                    .cm_listen(ib_cm::service_id(ib_cm::RDMA_PS_TCP, p.spec.port), id)?,
                Role::Client => p.connect(ctx)?,
            }
            return Ok(p);
        }
        let sock = ctx.new_bulk_tcp_socket(TCP_BUFFER)?;
        let mut p = PerftestCm::new(id, verb, role, transport, spec, Some(sock), ctx.now);
        let r = match role {
            Role::Server => tcp_listen(ctx, sock, p.spec.port),
            Role::Client => p.connect(ctx),
        };
        if let Err(e) = r {
            ctx.sockets.remove(sock);
            return Err(e);
        }
        Ok(p)
    }

    fn new(
        id: u32,
        verb: Verb,
        role: Role,
        transport: TransportKind,
        spec: ServiceSpec,
        sock: Option<SocketHandle>,
        now: Instant,
    ) -> Self {
        PerftestCm {
            id,
            verb,
            role,
            transport,
            connect_deadline: now + spec.connect_timeout,
            spec,
            sock,
            retry_at: None,
            done: false,
            session: None,
            closing: Vec::new(),
            tally: SessionTally::default(),
            counters: IwarpCounters::default(),
        }
    }

    /// perftest's `ib_send_bw` uses credits over iWARP only (no RNR
    /// retry there); over RoCE the sender relies on RNR retry.
    fn credits(&self) -> bool {
        self.verb == Verb::Send && self.transport == TransportKind::Iwarp
    }

    /// QP sizes of a RoCE connection (control: one message each way at a
    /// time; data: the operations in flight, the SEND server's receives).
    fn qp_caps(&self, data: bool) -> QpCaps {
        if data {
            QpCaps {
                max_send_wr: 2 * DEPTH as usize,
                max_recv_wr: self.spec.rx_depth as usize + 2,
                max_sge: 1,
                ..QpCaps::default()
            }
        } else {
            QpCaps {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_sge: 1,
                ..QpCaps::default()
            }
        }
    }

    /// RoCE client: a CM REQ for a new connection to the tool's port.
    fn roce_connect(&self, ctx: &mut ServiceCtx<'_>, data: bool) -> Result<Endpoint, HostError> {
        let (_, ep) = roce_connect(
            ctx,
            self.id,
            &self.spec,
            self.qp_caps(data),
            READ_DEPTH as u8,
            crate::endpoint::RDMA_CM_ACK_TIMEOUT,
        )?;
        Ok(Endpoint::Roce(ep))
    }

    fn script(&self) -> &'static [usize] {
        match self.verb {
            Verb::Send => &SEND_SCRIPT,
            _ => &WRITE_SCRIPT,
        }
    }

    /// The client runs its operations before this item.
    fn run_before(&self) -> usize {
        match self.verb {
            Verb::Send => 10,
            _ => 9,
        }
    }

    /// The send window both tools use for SEND: `rx_depth`, at most the
    /// iterations.
    fn window(&self) -> u32 {
        self.spec.rx_depth.min(self.spec.iters).max(1)
    }

    /// iWARP counters of this service.
    pub fn counters(&self) -> IwarpCounters {
        self.counters
    }

    fn engine_config(&self, data: bool) -> siw::Config {
        let mut c = engine_config(self.spec.mpa_crc, IRD_ORD, IRD_ORD);
        if data {
            let n = self.spec.rx_depth as usize + 2;
            c.rq_depth = c.rq_depth.max(n);
            c.sq_depth = c.sq_depth.max(2 * DEPTH as usize);
        }
        c
    }

    fn connect(&mut self, ctx: &mut ServiceCtx<'_>) -> Result<(), HostError> {
        if self.transport == TransportKind::Roce {
            let ep = self.roce_connect(ctx, false)?;
            let peer = self.spec.peer.unwrap_or(Ipv4Addr::UNSPECIFIED);
            let ctl = control_conn(ep, ctx.rdma, ctx.now)
                .map_err(|e| HostError::Invalid(e.to_string()))?;
            self.session = Some(self.new_session(ctx, peer, ctl));
            self.retry_at = None;
            return Ok(());
        }
        let (peer, sock) = client_target(&self.spec, self.sock)?;
        tcp_connect(ctx, sock, peer, self.spec.port)?;
        self.retry_at = None;
        Ok(())
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let mut t: Vec<Instant> = self.closing.iter().map(|(_, d)| *d).collect();
        t.extend(self.retry_at);
        if let Some(s) = &self.session {
            t.push(s.last_progress + STALL_TIMEOUT);
            t.extend(s.ctl.ep.poll_timeout());
            t.extend(s.ctl.ready_at);
            t.extend(s.data_retry_at);
            t.extend(s.items_done.map(|d| d + CLOSE_WAIT));
            if s.items_done.is_some() && !s.data_closing && self.role == Role::Server {
                t.push(s.last_progress + DATA_QUIET);
            }
            if let Some(d) = &s.data {
                t.extend(d.ep.poll_timeout());
                t.extend(d.ready_at);
            }
        }
        t.into_iter().min()
    }

    pub(crate) fn teardown(
        &mut self,
        sockets: &mut SocketSet<'static>,
        rdma: &mut RdmaDevice,
        now: Instant,
    ) {
        let mut socks: Vec<SocketHandle> = self.closing.drain(..).map(|(h, _)| h).collect();
        socks.extend(self.sock.take());
        if let Some(mut s) = self.session.take() {
            socks.extend(s.ctl.ep.socket());
            s.ctl.ep.release(rdma, now);
            if let Some(mut d) = s.data.take() {
                socks.extend(d.ep.socket());
                d.ep.release(rdma, now);
            }
            socks.extend(s.data_sock);
        }
        if self.transport == TransportKind::Roce {
            rdma.cm_release_owner(self.id, now);
        }
        abort_sockets(sockets, socks);
        self.done = true;
    }

    pub(crate) fn status(&self, id: u32) -> ServiceStatus {
        let state = match (&self.session, self.role) {
            (Some(s), _) if s.items_done.is_some() => "closing",
            (Some(s), Role::Client) if !s.ctl.connected => "connecting",
            (Some(_), _) => "running",
            (None, Role::Server) => "listening",
            (None, Role::Client) if !self.done && self.retry_at.is_some() => "waiting-for-server",
            (None, Role::Client) if !self.done => "connecting",
            (None, Role::Client) => self.tally.stopped_state(),
        };
        let peer = self.session.as_ref().map(|s| s.peer).or(self.spec.peer);
        let progress = self
            .session
            .as_ref()
            .map_or((0, 0), |s| (s.step as u32, self.count(s)));
        self.tally.status(id, &self.spec, peer, state, progress)
    }

    /// What this side counted in session `s` (see the module docs).
    fn count(&self, s: &Session) -> u32 {
        match self.role {
            Role::Client => s.completed,
            Role::Server => match self.verb {
                Verb::Send => s.received,
                _ => s.data.as_ref().map_or(0, |d| d.peer_msgs as u32),
            },
        }
    }

    /// Runs the state machine; returns whether anything changed.
    pub(crate) fn step(&mut self, ctx: &mut ServiceCtx<'_>) -> bool {
        let mut moved = self.reap(ctx);
        if self.transport == TransportKind::Roce {
            moved |= dispatch_cm(self, self.id, ctx);
        }
        moved |= match self.role {
            Role::Server => self.step_listener(ctx),
            Role::Client => self.step_client_connect(ctx),
        };
        if let Some(mut s) = self.session.take() {
            moved |= self.run_session(ctx, &mut s);
            if s.ctl.refused && !s.ctl.connected {
                // RoCE: the tool does not listen yet; try again.
                s.ctl.ep.release(ctx.rdma, ctx.now);
                if ctx.now + RETRY_INTERVAL < self.connect_deadline {
                    self.retry_at = Some(ctx.now + RETRY_INTERVAL);
                } else {
                    self.fail_client(ctx, "could not reach the server".into());
                }
                return true;
            }
            if self.session_over(ctx, &s) {
                self.finish(ctx, s);
                moved = true;
            } else {
                self.session = Some(s);
            }
        }
        moved
    }

    /// Removes closed sockets of ended sessions.
    fn reap(&mut self, ctx: &mut ServiceCtx<'_>) -> bool {
        let before = self.closing.len();
        self.closing.retain(|&(h, deadline)| {
            let sock = ctx.sockets.get_mut::<Socket>(h);
            drain_and_close(sock);
            let gone = matches!(sock.state(), State::Closed | State::TimeWait);
            if gone || ctx.now >= deadline {
                sock.abort();
                ctx.sockets.remove(h);
                false
            } else {
                true
            }
        });
        before != self.closing.len()
    }

    /// Server: the listening socket got a connection: the control
    /// connection of a new session, or the running session's data
    /// connection.
    fn step_listener(&mut self, ctx: &mut ServiceCtx<'_>) -> bool {
        let Some(h) = self.sock else { return false };
        let sock = ctx.sockets.get_mut::<Socket>(h);
        let Some(peer) = accepted_peer(sock, self.spec.port, &mut self.tally.last_error) else {
            return false;
        };
        let wanted = match &self.session {
            None => true,
            Some(s) => s.data.is_none() && s.peer == peer && s.step >= 4,
        };
        if !wanted {
            // One session at a time: refuse others.
            ctx.sockets.get_mut::<Socket>(h).abort();
            return true;
        }
        let next = match ctx.new_bulk_tcp_socket(TCP_BUFFER) {
            Ok(n) => n,
            Err(e) => {
                ctx.sockets.get_mut::<Socket>(h).abort();
                self.tally.last_error = Some(e.to_string());
                return true;
            }
        };
        if let Err(e) = ctx.sockets.get_mut::<Socket>(next).listen(self.spec.port) {
            ctx.sockets.remove(next);
            ctx.sockets.get_mut::<Socket>(h).abort();
            self.tally.last_error = Some(format!("listen: {e}"));
            return true;
        }
        self.sock = Some(next);
        let data = self.session.is_some();
        let ep = Endpoint::Iwarp(Box::new(IwarpEndpoint::responder(
            h,
            self.engine_config(data),
            ctx.now,
        )));
        self.adopt(ctx, peer, ep, data);
        true
    }

    /// Takes `ep`, just accepted from `peer` (RoCE or iWARP alike), as the
    /// running session's data connection when `data`, else as the control
    /// connection of a new session. A data connection that fails to come up
    /// fails the session; a control one, the service's last error.
    fn adopt(&mut self, ctx: &mut ServiceCtx<'_>, peer: Ipv4Addr, ep: Endpoint, data: bool) {
        if data {
            let conn = self.data_conn(ep, ctx.rdma, ctx.now);
            if let Some(s) = self.session.as_mut() {
                match conn {
                    Ok(c) => s.data = Some(c),
                    Err(e) => {
                        s.error.get_or_insert(e.to_string());
                    }
                }
                s.last_progress = ctx.now;
            }
        } else {
            match control_conn(ep, ctx.rdma, ctx.now) {
                Ok(ctl) => self.session = Some(self.new_session(ctx, peer, ctl)),
                Err(e) => self.tally.last_error = Some(e.to_string()),
            }
        }
    }

    fn new_session(&self, ctx: &mut ServiceCtx<'_>, peer: Ipv4Addr, mut ctl: Conn) -> Session {
        let mut error = None;
        if let Err(e) = post_ctl_recv(&mut ctl, ctx.rdma) {
            error = Some(e.to_string());
        }
        let qpn = match ctl.ep.roce() {
            Some(r) => r.qpn(),
            None => 0x100 + self.id,
        };
        Session {
            peer,
            ctl,
            data: None,
            data_sock: None,
            data_retry_at: None,
            data_deadline: None,
            inbox: VecDeque::new(),
            step: 0,
            sent: false,
            keys: Dest {
                out_reads: u32::from(READ_DEPTH as u16),
                qpn,
                psn: (ctx.rng.next_u64() & 0xff_ffff) as u32,
                gid: gid_of(ctx.ip),
                ..Dest::default()
            },
            remote: None,
            posted: 0,
            completed: 0,
            received: 0,
            credited: 0,
            run_started: None,
            run_elapsed: Duration::ZERO,
            started: ctx.now,
            last_progress: ctx.now,
            items_done: None,
            data_closing: false,
            their_iters: None,
            error,
        }
    }

    /// A data connection with its buffers registered (and, for the SEND
    /// server, its receives posted).
    fn data_conn(
        &self,
        mut ep: Endpoint,
        rdma: &mut RdmaDevice,
        now: Instant,
    ) -> Result<Conn, PerftestCmError> {
        let len = 2 * self.spec.size.max(CYCLE_BUFFER) as usize;
        let access = match (self.role, self.verb) {
            (Role::Server, Verb::Write) => Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            (Role::Server, Verb::Read) => Access::REMOTE_READ,
            _ => Access::LOCAL_WRITE,
        };
        let data = if (self.role, self.verb) == (Role::Server, Verb::Atomic) {
            // the client's FETCH AND ADDs land on the start of the buffer
            ep.register_atomic_target(rdma, len, DATA_VA)
        } else {
            ep.register(rdma, len, DATA_VA, access)
        };
        let keys = data.and_then(|data| {
            let credit = match self.role {
                // Credits from the server land here.
                Role::Client => ep.register(
                    rdma,
                    8,
                    CREDIT_VA,
                    Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                ),
                // The source of our credit WRITEs.
                Role::Server => ep.register(rdma, 8, CREDIT_SRC_VA, Access::LOCAL_WRITE),
            }?;
            Ok((data, credit))
        });
        let (data, credit) = match keys {
            Ok(k) => k,
            Err(e) => {
                ep.release(rdma, now);
                return Err(PerftestCmError::DataBuffer(e));
            }
        };
        let mut c = Conn::new(ep, data, credit);
        if self.role == Role::Server && self.verb == Verb::Send {
            for _ in 0..self.spec.rx_depth {
                if post_data_recv(&mut c, rdma, self.spec.size).is_err() {
                    break;
                }
            }
        }
        Ok(c)
    }

    /// Client: connects the control connection (retrying while the tool
    /// does not listen) and starts the session on it.
    fn step_client_connect(&mut self, ctx: &mut ServiceCtx<'_>) -> bool {
        if self.done || self.session.is_some() {
            return false;
        }
        if self.transport == TransportKind::Roce {
            if self.retry_at.is_some_and(|t| ctx.now >= t) {
                if let Err(e) = self.connect(ctx) {
                    self.fail_client(ctx, e.to_string());
                }
                return true;
            }
            return false;
        }
        let Some(h) = self.sock else { return false };
        if let Some(t) = self.retry_at {
            if ctx.now < t {
                return false;
            }
            if let Err(e) = self.connect(ctx) {
                self.fail_client(ctx, e.to_string());
            }
            return true;
        }
        let sock = ctx.sockets.get_mut::<Socket>(h);
        match sock.state() {
            State::Closed | State::TimeWait => {
                sock.abort();
                if ctx.now + RETRY_INTERVAL < self.connect_deadline {
                    self.retry_at = Some(ctx.now + RETRY_INTERVAL);
                } else {
                    self.fail_client(ctx, "could not reach the server".into());
                }
                return true;
            }
            State::Established => {}
            _ => return false,
        }
        let peer = self.spec.peer.unwrap_or(Ipv4Addr::UNSPECIFIED);
        match IwarpEndpoint::initiator(h, self.engine_config(false), &[], ctx.now) {
            Ok(ep) => {
                self.sock = None;
                match control_conn(Endpoint::Iwarp(Box::new(ep)), ctx.rdma, ctx.now) {
                    Ok(ctl) => self.session = Some(self.new_session(ctx, peer, ctl)),
                    Err(e) => self.fail_client(ctx, e.to_string()),
                }
            }
            Err(e) => self.fail_client(ctx, format!("MPA request: {e}")),
        }
        true
    }

    fn fail_client(&mut self, ctx: &mut ServiceCtx<'_>, reason: String) {
        self.done = true;
        self.retry_at = None;
        self.tally.failed(ctx, self.id, self.spec.peer, reason);
    }

    /// Client: the data connection's TCP connect, with retries.
    fn step_data_connect(&mut self, ctx: &mut ServiceCtx<'_>, s: &mut Session) -> bool {
        if self.transport == TransportKind::Roce {
            return self.step_data_connect_roce(ctx, s);
        }
        let Some(h) = s.data_sock else { return false };
        if let Some(t) = s.data_retry_at {
            if ctx.now < t {
                return false;
            }
            s.data_retry_at = None;
            if let Err(e) = tcp_connect(ctx, h, s.peer, self.spec.port) {
                s.error.get_or_insert(e.to_string());
            }
            return true;
        }
        let sock = ctx.sockets.get_mut::<Socket>(h);
        match sock.state() {
            State::Closed | State::TimeWait => {
                sock.abort();
                if s.data_deadline.is_some_and(|d| ctx.now >= d) {
                    s.error
                        .get_or_insert("the server did not accept the data connection".into());
                } else {
                    s.data_retry_at = Some(ctx.now + DATA_RETRY_INTERVAL);
                }
                true
            }
            State::Established => {
                s.data_sock = None;
                match IwarpEndpoint::initiator(h, self.engine_config(true), &[], ctx.now) {
                    Ok(ep) => {
                        match self.data_conn(Endpoint::Iwarp(Box::new(ep)), ctx.rdma, ctx.now) {
                            Ok(c) => s.data = Some(c),
                            Err(e) => {
                                s.error.get_or_insert(e.to_string());
                            }
                        }
                    }
                    Err(e) => {
                        self.closing.push((h, ctx.now + LINGER));
                        s.error.get_or_insert(format!("MPA request: {e}"));
                    }
                }
                true
            }
            _ => false,
        }
    }

    /// RoCE client: the data connection's REQ, again while the tool's
    /// server refuses it (it listens again only after item 4).
    fn step_data_connect_roce(&mut self, ctx: &mut ServiceCtx<'_>, s: &mut Session) -> bool {
        if let Some(d) = s.data.as_mut().filter(|d| d.refused && !d.connected) {
            d.ep.release(ctx.rdma, ctx.now);
            s.data = None;
            if s.data_deadline.is_some_and(|t| ctx.now >= t) {
                s.error
                    .get_or_insert("the server did not accept the data connection".into());
            } else {
                s.data_retry_at = Some(ctx.now + DATA_RETRY_INTERVAL);
            }
            return true;
        }
        if s.data.is_some() || s.data_retry_at.is_none_or(|t| ctx.now < t) {
            return false;
        }
        s.data_retry_at = None;
        match self
            .roce_connect(ctx, true)
            .map_err(PerftestCmError::from)
            .and_then(|ep| self.data_conn(ep, ctx.rdma, ctx.now))
        {
            Ok(c) => s.data = Some(c),
            Err(e) => {
                s.error.get_or_insert(e.to_string());
            }
        }
        true
    }

    fn run_session(&mut self, ctx: &mut ServiceCtx<'_>, s: &mut Session) -> bool {
        let mut moved = false;
        if self.role == Role::Client {
            moved |= self.step_data_connect(ctx, s);
        }
        s.ctl.ep.handle_timeout(ctx.now);
        // A settle time that has passed is no longer a timer.
        s.ctl.ready_at = s.ctl.ready_at.filter(|&t| t > ctx.now);
        if let Some(d) = s.data.as_mut() {
            d.ep.handle_timeout(ctx.now);
            d.ready_at = d.ready_at.filter(|&t| t > ctx.now);
        }
        // READ requests (and atomics, RoCE only) leave no event at the responder
        let reads = matches!(self.verb, Verb::Read | Verb::Atomic);
        for _ in 0..64 {
            let mut round = s.ctl.ep.pump(ctx.sockets, ctx.rdma);
            while let Some(ev) = s.ctl.ep.poll_event() {
                round = true;
                s.last_progress = ctx.now;
                self.on_ctl_event(ctx, s, ev);
            }
            if s.data.is_some() {
                let mut evs = Vec::new();
                if let Some(d) = s.data.as_mut() {
                    let pumped = d.ep.pump(ctx.sockets, ctx.rdma);
                    let n = d.ep.peer_messages(ctx.rdma, reads);
                    if pumped || n != d.peer_msgs {
                        // WRITEs and READ requests leave no event here.
                        d.peer_msgs = n;
                        round = true;
                        s.last_progress = ctx.now;
                    }
                    while let Some(ev) = d.ep.poll_event() {
                        evs.push(ev);
                    }
                }
                for ev in evs {
                    round = true;
                    s.last_progress = ctx.now;
                    self.on_data_event(ctx, s, ev);
                }
            }
            if s.error.is_none() {
                let r = match self.role {
                    Role::Server => self.advance_server(ctx, s),
                    Role::Client => self.advance_client(ctx, s),
                };
                match r {
                    Ok(m) => round |= m,
                    Err(e) => {
                        s.error.get_or_insert(e.to_string());
                    }
                }
            }
            if s.error.is_some() {
                s.ctl.ep.close(ctx.rdma, ctx.now);
                if let Some(d) = s.data.as_mut() {
                    d.ep.close(ctx.rdma, ctx.now);
                }
            }
            moved |= round;
            if !round {
                break;
            }
        }
        if s.error.is_none()
            && s.items_done.is_none()
            && ctx.now.saturating_duration_since(s.last_progress) >= STALL_TIMEOUT
        {
            s.error = Some(format!(
                "no progress for {} s (item {}, {} operations)",
                STALL_TIMEOUT.as_secs(),
                s.step,
                self.count(s)
            ));
        }
        moved
    }

    fn on_ctl_event(&mut self, ctx: &mut ServiceCtx<'_>, s: &mut Session, ev: EpEvent) {
        match ev {
            EpEvent::ConnectRequest => {
                // perftest accepts without private data.
                if s.ctl.ep.accept().is_err() {
                    s.error.get_or_insert("accept failed".into());
                }
            }
            EpEvent::Connected { crc, qpns } => {
                if self.transport == TransportKind::Iwarp {
                    self.count_connected(crc);
                }
                s.ctl.connected = true;
                s.started = ctx.now;
                if self.role == Role::Client {
                    s.ctl.ready_at = Some(ctx.now + CONTROL_SETTLE);
                }
                session_started(ctx, self.id, s.peer, qpns.0, qpns.1);
            }
            EpEvent::Rejected(why) => {
                if self.transport == TransportKind::Roce
                    && self.role == Role::Client
                    && !s.ctl.connected
                {
                    s.ctl.refused = true;
                } else {
                    s.error
                        .get_or_insert(format!("control connection refused: {why}"));
                }
            }
            EpEvent::Completion(c) => {
                if let Err(e) = on_ctl_completion(s, ctx.rdma, c) {
                    s.error.get_or_insert(e.to_string());
                }
            }
            EpEvent::Iwarp(e) => {
                if s.items_done.is_none() {
                    self.counters.count(&e);
                    s.error
                        .get_or_insert(format!("control connection at item {}: {e}", s.step));
                }
            }
            EpEvent::Closed => {
                s.ctl.closed = true;
                if s.items_done.is_none() && !s.ctl.refused {
                    s.error
                        .get_or_insert(format!("control connection closed at item {}", s.step));
                }
            }
        }
    }

    fn count_connected(&mut self, crc: bool) {
        self.counters.connected += 1;
        if crc {
            self.counters.connected_crc += 1;
        }
    }

    fn on_data_event(&mut self, ctx: &mut ServiceCtx<'_>, s: &mut Session, ev: EpEvent) {
        let Some(d) = s.data.as_mut() else { return };
        match ev {
            EpEvent::ConnectRequest => {
                if d.ep.accept().is_err() {
                    s.error.get_or_insert("accept failed".into());
                }
            }
            EpEvent::Connected { crc, .. } => {
                d.connected = true;
                // Our first FPDU on it waits a little (Linux siw's accept
                // race); the client's first item after it too.
                d.ready_at = Some(ctx.now + crate::rping::FIRST_SEND_DELAY);
                if self.transport == TransportKind::Iwarp {
                    self.count_connected(crc);
                }
            }
            EpEvent::Rejected(why) => {
                if self.transport == TransportKind::Roce
                    && self.role == Role::Client
                    && !d.connected
                {
                    d.refused = true;
                } else {
                    s.error
                        .get_or_insert(format!("data connection refused: {why}"));
                }
            }
            EpEvent::Completion(c) => {
                if let Err(e) = self.on_data_completion(s, ctx.rdma, c) {
                    s.error.get_or_insert(e.to_string());
                }
            }
            EpEvent::Iwarp(e) => {
                if s.items_done.is_none() {
                    self.counters.count(&e);
                    s.error.get_or_insert(format!(
                        "data connection after {} operations: {e}",
                        self.count(s)
                    ));
                }
            }
            EpEvent::Closed => {
                d.closed = true;
                // The server closes the data connection once it answered
                // the last item; over RoCE its DREQ (on QP1) may overtake
                // that answer (on the control QP).
                let last_sent =
                    self.role == Role::Client && s.sent && s.step + 1 == self.script().len();
                if s.items_done.is_none() && !d.refused && !last_sent {
                    s.error.get_or_insert(format!(
                        "data connection closed at item {} after {} operations",
                        s.step,
                        self.count(s)
                    ));
                }
            }
        }
    }

    fn on_data_completion(
        &mut self,
        s: &mut Session,
        rdma: &mut RdmaDevice,
        c: Completion,
    ) -> Result<(), PerftestCmError> {
        let failed = |opcode, status| PerftestCmError::DataCompletion { opcode, status };
        if !has_work(&c, failed)? {
            return Ok(());
        }
        match (self.role, c.opcode) {
            (Role::Server, WcOpcode::Recv) => {
                if c.byte_len > self.spec.size {
                    return Err(PerftestCmError::SendTooLong(c.byte_len));
                }
                s.received += 1;
                let d = s.data.as_mut().ok_or(PerftestCmError::NoDataConnection)?;
                post_data_recv(d, rdma, self.spec.size)?;
                let every = (self.window() / 3).max(1);
                if self.credits() && s.received.is_multiple_of(every) {
                    self.send_credit(s, rdma)?;
                }
            }
            (Role::Server, WcOpcode::Write) => {} // a credit left
            (Role::Client, WcOpcode::Write | WcOpcode::Read | WcOpcode::Send)
                if c.wr_id == WR_OP =>
            {
                s.completed += 1;
            }
            (_, op) => return Err(PerftestCmError::UnexpectedDataCompletion(op)),
        }
        Ok(())
    }

    /// SEND server: RDMA WRITE our count of receives to the client's
    /// credit buffer.
    fn send_credit(&self, s: &mut Session, rdma: &mut RdmaDevice) -> Result<(), PerftestCmError> {
        let Some(r) = s.remote.filter(|r| r.rkey != 0) else {
            return Ok(()); // the client's keys are not known yet
        };
        let d = s.data.as_mut().ok_or(PerftestCmError::NoDataConnection)?;
        let src = d.stag_b;
        d.ep.mem_write(rdma, src, CREDIT_SRC_VA, &s.received.to_le_bytes())
            .map_err(PerftestCmError::CreditBuffer)?;
        d.ep.post_send(
            rdma,
            WR_CREDIT,
            WorkRequest::Write {
                local: Sge {
                    stag: src,
                    addr: CREDIT_SRC_VA,
                    len: 4,
                },
                remote_stag: r.rkey,
                remote_addr: r.vaddr,
            },
        )
        .map_err(PerftestCmError::PostCredit)?;
        s.credited = s.received;
        Ok(())
    }

    /// The keys we send at item `step`.
    fn our_keys(&self, s: &mut Session) -> [u8; DEST_LEN] {
        if s.step < REAL_KEYS_ITEM {
            return [0; DEST_LEN];
        }
        if let Some(d) = &s.data {
            if self.credits() {
                // The credit buffer (client) / its source (server, unused).
                s.keys.rkey = d.stag_b;
                s.keys.vaddr = if self.role == Role::Client {
                    CREDIT_VA
                } else {
                    CREDIT_SRC_VA
                };
            } else {
                s.keys.rkey = d.stag_a;
                s.keys.vaddr = DATA_VA;
            }
        }
        s.keys.encode()
    }

    /// Our part of item `step` (both roles).
    fn our_item(&self, s: &mut Session) -> Vec<u8> {
        let len = self.script()[s.step];
        let is_report = self.verb != Verb::Send && (10..=14).contains(&s.step);
        match s.step {
            0..=2 => opening_item(s.step),
            // IBV_MTU_1024 as text: what siw reports on a 1500-byte netdev.
            3 => b"3\0".to_vec(),
            _ if is_report => {
                let v = match (self.role, s.step) {
                    (_, 10) => u64::from(self.spec.size).to_be_bytes(),
                    (Role::Server, 11) => u64::from(self.spec.iters).to_be_bytes(),
                    (Role::Client, 11) => u64::from(s.completed).to_be_bytes(),
                    (Role::Client, _) => {
                        // Peak and average MiB/s, then Mpps (doubles).
                        let secs = s.run_elapsed.as_secs_f64().max(1e-9);
                        let n = f64::from(s.completed);
                        let v = if s.step == 14 {
                            n / secs / 1e6
                        } else {
                            n * f64::from(self.spec.size) / secs / f64::from(1u32 << 20)
                        };
                        v.to_bits().to_be_bytes()
                    }
                    (Role::Server, _) => [0; 8],
                };
                v.to_vec()
            }
            _ if len == DEST_LEN => self.our_keys(s).to_vec(),
            _ => vec![0; len],
        }
    }

    /// Checks and takes the peer's part of item `step`.
    fn their_item(&self, s: &mut Session, msg: &[u8]) -> Result<(), PerftestCmError> {
        let want = self.script()[s.step];
        if msg.len() != want {
            return Err(PerftestCmError::ItemSize {
                item: s.step,
                got: msg.len(),
                want,
            });
        }
        match s.step {
            0 => check_peer_version(msg).map_err(PerftestCmError::Version)?,
            11 if want == 8 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(msg);
                s.their_iters = Some(u64::from_be_bytes(b));
            }
            n if n >= REAL_KEYS_ITEM && want == DEST_LEN => {
                let k = Dest::decode(msg).ok_or(PerftestCmError::BadKeys)?;
                s.remote = Some(k);
            }
            _ => {}
        }
        Ok(())
    }

    fn send_ctl(
        &self,
        s: &mut Session,
        rdma: &mut RdmaDevice,
        msg: &[u8],
    ) -> Result<(), PerftestCmError> {
        let send = s.ctl.stag_b;
        let ep = &mut s.ctl.ep;
        ep.mem_write(rdma, send, CTL_SEND_VA, msg)
            .map_err(PerftestCmError::ControlBuffer)?;
        ep.post_send(
            rdma,
            WR_CTL_SEND,
            WorkRequest::Send {
                local: Sge {
                    stag: send,
                    addr: CTL_SEND_VA,
                    len: msg.len() as u32,
                },
                solicited: false,
                invalidate: None,
            },
        )
        .map_err(PerftestCmError::PostControlSend)
    }

    fn advance_server(
        &mut self,
        ctx: &mut ServiceCtx<'_>,
        s: &mut Session,
    ) -> Result<bool, PerftestCmError> {
        let mut moved = false;
        while let Some(msg) = s.inbox.pop_front() {
            moved = true;
            if s.step >= self.script().len() {
                return Err(PerftestCmError::AfterLastItem);
            }
            if s.step >= FIRST_DATA_ITEM && !s.data.as_ref().is_some_and(|d| d.connected) {
                if s.data.is_some() {
                    // RoCE: the client's RTU for the data connection (on
                    // QP1, from the kernel's MAD path) may trail its next
                    // item (a SEND on the control QP); wait for it.
                    s.inbox.push_front(msg);
                    return Ok(false);
                }
                return Err(PerftestCmError::BeforeDataConnection(s.step));
            }
            if self.verb == Verb::Send
                && s.step + 1 == self.script().len()
                && s.received < self.spec.iters
            {
                // The tool's server answers the close item only after all
                // its receives completed; the last SENDs may still be on
                // their way on the other connection.
                s.inbox.push_front(msg);
                return Ok(false);
            }
            self.their_item(s, &msg)?;
            let reply = self.our_item(s);
            self.send_ctl(s, ctx.rdma, &reply)?;
            s.step += 1;
            if s.step == self.script().len() {
                s.items_done = Some(ctx.now);
            }
        }
        if let Some(t) = s.items_done.filter(|_| !s.data_closing) {
            // rdma_disconnect of the data connection (the control
            // connection goes when the tool exits), once the client's last
            // WRITEs, which may trail its report on the other connection,
            // are in.
            let want = s.their_iters.unwrap_or(0);
            let in_ = u64::from(self.count(s)) >= want || self.verb != Verb::Write;
            let quiet = ctx.now.saturating_duration_since(t.max(s.last_progress)) >= DATA_QUIET;
            if in_ || quiet {
                s.data_closing = true;
                s.items_done = Some(ctx.now);
                if let Some(d) = s.data.as_mut() {
                    d.ep.close(ctx.rdma, ctx.now);
                }
                moved = true;
            }
        }
        Ok(moved)
    }

    fn advance_client(
        &mut self,
        ctx: &mut ServiceCtx<'_>,
        s: &mut Session,
    ) -> Result<bool, PerftestCmError> {
        let mut moved = false;
        loop {
            if s.step >= self.script().len() {
                if s.items_done.is_none() {
                    s.items_done = Some(ctx.now);
                    moved = true;
                }
                return Ok(moved);
            }
            if s.step == self.run_before() && s.run_elapsed.is_zero() {
                return Ok(self.run_ops(ctx, s)? || moved);
            }
            if !s.sent {
                if !s.ctl.ready(ctx.now) {
                    return Ok(moved);
                }
                if s.step >= FIRST_DATA_ITEM && !s.data.as_ref().is_some_and(|d| d.ready(ctx.now)) {
                    return Ok(moved);
                }
                let item = self.our_item(s);
                self.send_ctl(s, ctx.rdma, &item)?;
                s.sent = true;
                moved = true;
            }
            let Some(msg) = s.inbox.pop_front() else {
                return Ok(moved);
            };
            self.their_item(s, &msg)?;
            if s.step == FIRST_DATA_ITEM - 1 {
                // The tool's server now listens for the data connection.
                if self.transport == TransportKind::Roce {
                    s.data_deadline = Some(ctx.now + DATA_CONNECT_TIMEOUT);
                    s.data_retry_at = Some(ctx.now);
                    s.step += 1;
                    s.sent = false;
                    moved = true;
                    continue;
                }
                let h = ctx.new_bulk_tcp_socket(TCP_BUFFER)?;
                s.data_sock = Some(h);
                s.data_deadline = Some(ctx.now + DATA_CONNECT_TIMEOUT);
                tcp_connect(ctx, h, s.peer, self.spec.port)?;
            }
            s.step += 1;
            s.sent = false;
            moved = true;
        }
    }

    /// Client: posts operations as the depth (and, for SEND, the credits)
    /// allow; ends the run when all completed.
    fn run_ops(
        &mut self,
        ctx: &mut ServiceCtx<'_>,
        s: &mut Session,
    ) -> Result<bool, PerftestCmError> {
        let iters = self.spec.iters;
        if s.completed >= iters {
            let t0 = s.run_started.unwrap_or(ctx.now);
            s.run_elapsed = ctx
                .now
                .saturating_duration_since(t0)
                .max(Duration::from_nanos(1));
            return Ok(true);
        }
        let r = s.remote.ok_or(PerftestCmError::NoKeys)?;
        let window = self.window();
        let depth = if matches!(self.verb, Verb::Read | Verb::Atomic) {
            READ_DEPTH
        } else {
            DEPTH
        };
        let size = self.spec.size;
        let d = s.data.as_mut().ok_or(PerftestCmError::NoDataConnection)?;
        if !d.ready(ctx.now) {
            return Ok(false);
        }
        s.run_started.get_or_insert(ctx.now);
        let (data, credit_stag) = (d.stag_a, d.stag_b);
        let credits = self.credits();
        let credit = if credits {
            d.ep.mem_read(ctx.rdma, credit_stag, CREDIT_VA, 4)
                .and_then(|b| b.try_into().ok())
                .map_or(0, u32::from_le_bytes)
        } else {
            0
        };
        let mut moved = false;
        while s.posted < iters && s.posted - s.completed < depth {
            if credits && s.posted.wrapping_sub(credit) >= window {
                break;
            }
            let local = Sge {
                stag: data,
                addr: DATA_VA,
                // ib_atomic_bw's operations are 8 bytes
                len: if self.verb == Verb::Atomic { 8 } else { size },
            };
            let remote_stag = r.rkey;
            let remote_addr = r.vaddr;
            let posted = match self.verb {
                // perftest's default atomic: FETCH AND ADD of 1 on the
                // server's buffer (RoCE only: siw's work requests have none)
                Verb::Atomic => {
                    d.ep.post_fetch_add(ctx.rdma, WR_OP, local, remote_stag, remote_addr, 1)
                }
                Verb::Write => d.ep.post_send(
                    ctx.rdma,
                    WR_OP,
                    WorkRequest::Write {
                        local,
                        remote_stag,
                        remote_addr,
                    },
                ),
                Verb::Read => d.ep.post_send(
                    ctx.rdma,
                    WR_OP,
                    WorkRequest::Read {
                        local,
                        remote_stag,
                        remote_addr,
                    },
                ),
                Verb::Send => d.ep.post_send(
                    ctx.rdma,
                    WR_OP,
                    WorkRequest::Send {
                        local,
                        solicited: false,
                        invalidate: None,
                    },
                ),
            };
            posted.map_err(|error| PerftestCmError::PostOperation { n: s.posted, error })?;
            s.posted += 1;
            moved = true;
        }
        Ok(moved)
    }

    /// Whether session `s` is over (failed, or done and closed).
    fn session_over(&self, ctx: &mut ServiceCtx<'_>, s: &Session) -> bool {
        if s.error.is_some() {
            return true;
        }
        let Some(t) = s.items_done else { return false };
        let data_closed = s.data.as_ref().is_none_or(|d| d.closed);
        let waited = ctx.now.saturating_duration_since(t) >= CLOSE_WAIT;
        match self.role {
            // We closed the data connection (items_done then restarts the
            // wait); the tool's exit closes the control connection.
            Role::Server => s.data_closing && ((data_closed && s.ctl.closed) || waited),
            // The tool's server disconnects the data connection.
            Role::Client => data_closed || waited,
        }
    }

    fn finish(&mut self, ctx: &mut ServiceCtx<'_>, mut s: Session) {
        let n = self.count(&s);
        s.ctl.ep.close(ctx.rdma, ctx.now);
        s.ctl.ep.pump(ctx.sockets, ctx.rdma);
        s.ctl.ep.release(ctx.rdma, ctx.now);
        let mut socks: Vec<SocketHandle> = s.ctl.ep.socket().into_iter().collect();
        if let Some(d) = s.data.as_mut() {
            d.ep.close(ctx.rdma, ctx.now);
            d.ep.pump(ctx.sockets, ctx.rdma);
            d.ep.release(ctx.rdma, ctx.now);
            socks.extend(d.ep.socket());
        }
        socks.extend(s.data_sock);
        for h in socks {
            self.closing.push((h, ctx.now + LINGER));
        }
        match s.error {
            None => {
                let elapsed = ctx.now.saturating_duration_since(s.started);
                self.tally.finished(ctx, self.id, s.peer, n, 0, elapsed);
            }
            Some(reason) => {
                self.tally.last_iterations = n;
                self.tally.failed(ctx, self.id, Some(s.peer), reason);
            }
        }
        if self.role == Role::Client {
            self.done = true;
        }
    }
}

fn control_conn(
    mut ep: Endpoint,
    rdma: &mut RdmaDevice,
    now: Instant,
) -> Result<Conn, PerftestCmError> {
    let keys = ep
        .register(rdma, DEST_LEN, CTL_RECV_VA, Access::LOCAL_WRITE)
        .and_then(|recv| {
            Ok((
                recv,
                ep.register(rdma, DEST_LEN, CTL_SEND_VA, Access::NONE)?,
            ))
        });
    let (recv, send) = match keys {
        Ok(k) => k,
        Err(e) => {
            ep.release(rdma, now);
            return Err(PerftestCmError::ControlBuffers(e));
        }
    };
    Ok(Conn::new(ep, recv, send))
}

/// The tool posts one receive of 56 bytes on the control QP at a time.
fn post_ctl_recv(c: &mut Conn, rdma: &mut RdmaDevice) -> Result<(), PerftestCmError> {
    let stag = c.stag_a;
    c.ep.post_recv(
        rdma,
        WR_CTL_RECV,
        Sge {
            stag,
            addr: CTL_RECV_VA,
            len: DEST_LEN as u32,
        },
    )
    .map_err(PerftestCmError::PostControlReceive)
}

fn post_data_recv(c: &mut Conn, rdma: &mut RdmaDevice, size: u32) -> Result<(), PerftestCmError> {
    let stag = c.stag_a;
    c.ep.post_recv(
        rdma,
        WR_DATA_RECV,
        Sge {
            stag,
            addr: DATA_VA,
            len: size,
        },
    )
    .map_err(PerftestCmError::PostReceive)
}

/// Whether completion `c` has work for its session: a flushed one has none
/// (its connection is ending), a failed one is the error `failed` makes.
fn has_work(
    c: &Completion,
    failed: impl FnOnce(WcOpcode, WcStatus) -> PerftestCmError,
) -> Result<bool, PerftestCmError> {
    match c.status {
        WcStatus::Flushed => Ok(false),
        WcStatus::Success => Ok(true),
        status => Err(failed(c.opcode, status)),
    }
}

/// A control receive or send completed.
fn on_ctl_completion(
    s: &mut Session,
    rdma: &mut RdmaDevice,
    c: Completion,
) -> Result<(), PerftestCmError> {
    let failed = |opcode, status| PerftestCmError::ControlCompletion { opcode, status };
    if !has_work(&c, failed)? {
        return Ok(());
    }
    match c.opcode {
        WcOpcode::Recv => {
            let stag = s.ctl.stag_a;
            let len = (c.byte_len as usize).min(DEST_LEN);
            let msg = s
                .ctl
                .ep
                .mem_read(rdma, stag, CTL_RECV_VA, len)
                .ok_or(PerftestCmError::ControlBufferUnreadable)?;
            s.inbox.push_back(msg);
            post_ctl_recv(&mut s.ctl, rdma)
        }
        WcOpcode::Send => Ok(()),
        op => Err(PerftestCmError::UnexpectedControlCompletion(op)),
    }
}

/// RoCE, through [`dispatch_cm`]: the CM's events go to the session's
/// connections; a request is a new session's control connection or the
/// running session's data connection, any other is refused.
impl CmService for PerftestCm {
    fn cm_request(&mut self, ctx: &mut ServiceCtx<'_>, request: CmRequest) {
        let CmRequest { conn, peer, remote } = request;
        let data = match &self.session {
            None => false,
            Some(s) => {
                if s.data.is_none() && s.peer == peer && s.step >= 4 {
                    true
                } else {
                    ctx.rdma
                        .cm_reject(conn, ib_cm::reject_reason::CONSUMER_DEFINED);
                    return;
                }
            }
        };
        if self.role != Role::Server {
            ctx.rdma
                .cm_reject(conn, ib_cm::reject_reason::CONSUMER_DEFINED);
            return;
        }
        let psn = ctx.rng.next_u64() as u32;
        let ep = match RoceEndpoint::accept(
            ctx.rdma,
            conn,
            peer,
            &remote,
            self.qp_caps(data),
            READ_DEPTH as u8,
            psn,
            crate::endpoint::RDMA_CM_ACK_TIMEOUT,
            ctx.now,
        ) {
            Ok(ep) => Endpoint::Roce(ep),
            Err(e) => {
                self.tally.last_error = Some(e.to_string());
                return;
            }
        };
        self.adopt(ctx, peer, ep, data);
    }

    fn cm_event(&mut self, ctx: &mut ServiceCtx<'_>, conn: ConnId, other: CmEvent) {
        if let Some(s) = self.session.as_mut() {
            let rdma = &mut *ctx.rdma;
            for c in std::iter::once(&mut s.ctl).chain(s.data.as_mut()) {
                if let Some(r) = c.ep.roce().filter(|r| r.conn() == conn) {
                    r.on_cm(rdma, other);
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The session errors' text is what `last_error` and the
    /// `SessionFailed` event show: the wording of the strings it replaced.
    #[test]
    fn session_errors_read_as_before() {
        let e = |e: PerftestCmError| e.to_string();
        assert_eq!(
            e(PerftestCmError::PostOperation {
                n: 7,
                error: EndpointError::NoAtomics
            }),
            "post operation 7: iWARP has no atomics"
        );
        assert_eq!(
            e(PerftestCmError::DataBuffer(EndpointError::Rdma(
                HostError::NoSuchQp(0x12)
            ))),
            "data buffer: no queue pair 0x12"
        );
        assert_eq!(
            e(PerftestCmError::ControlCompletion {
                opcode: WcOpcode::Send,
                status: WcStatus::Flushed
            }),
            "control Send completion: Flushed"
        );
        assert_eq!(
            e(PerftestCmError::ItemSize {
                item: 4,
                got: 3,
                want: DEST_LEN
            }),
            "item 4: 3 bytes, expected 56"
        );
        assert_eq!(
            e(PerftestCmError::Version(OldPeerVersion("5.60".into()))),
            "perftest version \"5.60\" (need >= 5.70)"
        );
        assert_eq!(
            e(PerftestCmError::UnexpectedDataCompletion(WcOpcode::Read)),
            "unexpected Read completion"
        );
    }

    #[test]
    fn dest_is_perftests_struct_big_endian() {
        let d = Dest {
            lid: 0,
            out_reads: 16,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234_5678,
            vaddr: 0x5555_0000_1000,
            gid: gid_of(Ipv4Addr::new(10, 77, 0, 1)),
            srqn: 0,
            gid_index: 1,
        };
        let b = d.encode();
        assert_eq!(&b[4..8], &[0, 0, 0, 16]);
        assert_eq!(&b[16..20], &[0x12, 0x34, 0x56, 0x78]);
        // 4 bytes of padding before the 8-byte vaddr.
        assert_eq!(&b[20..24], &[0; 4]);
        assert_eq!(&b[24..32], &[0, 0, 0x55, 0x55, 0, 0, 0x10, 0]);
        assert_eq!(&b[42..48], &[0xff, 0xff, 10, 77, 0, 1]);
        assert_eq!(Dest::decode(&b), Some(d));
        assert_eq!(Dest::decode(&b[..55]), None);
    }
}
