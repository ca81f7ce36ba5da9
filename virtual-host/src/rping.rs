//! `rping` (librdmacm examples) over iWARP, in both roles.
//!
//! The protocol as the tool speaks it, one ping:
//! 1. the client SENDs its source buffer as `{be64 addr, be32 rkey, be32 len}`
//!    (16 bytes), the buffer holding `"rdma-ping-K: "` followed by the
//!    letters `A`..`z` cycling from a start letter that advances every ping,
//!    NUL in the last byte;
//! 2. the server RDMA READs it into its own buffer and SENDs a 16-byte "go
//!    ahead" (contents unused);
//! 3. the client SENDs its sink buffer the same way;
//! 4. the server RDMA WRITEs `strlen + 1` bytes of what it read there and
//!    SENDs "go ahead" again;
//! 5. the client compares source and sink (`-V`) and prints `ping data:`.
//!
//! The client disconnects after `-C count` pings; the server then ends.
//! Connection: rdma_cm over iWARP, i.e. TCP to port 7174 and MPA with no
//! private data; both sides ask for 1 outstanding RDMA READ each way.
//!
//! Our server checks every buffer it reads against the tool's pattern for
//! that ping (a verified ping); our client checks that the sink holds its
//! source after each ping (the sink is zeroed before it is advertised).

use crate::endpoint::{Endpoint, EndpointError, EpEvent, RoceEndpoint, TransportKind};
use crate::iwarp::{engine_config, IwarpCounters, IwarpEndpoint};
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
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

pub use crate::spec::{
    RPING_DEFAULT_PORT as DEFAULT_PORT, RPING_DEFAULT_SIZE as DEFAULT_SIZE, UCMATOSE_PORT,
    UCMATOSE_SIZE,
};
/// rping's smallest buffer (`RPING_MIN_BUFSIZE`: what the 7.3 guest's rping
/// reports, "valid range is 23 to 65536").
pub const MIN_SIZE: u32 = 23;
/// rping's largest buffer (it refuses `-S 65536`: `RPING_BUFSIZE - 1`).
pub const MAX_SIZE: u32 = 64 * 1024 - 1;
/// Size of the buffer-advertisement message.
pub const INFO_LEN: usize = 16;
/// A session without progress for this long fails.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Reads/atomics in flight each way (rping asks for 1; room for more).
const RD_ATOMIC: u8 = 16;
/// Client reconnect interval while the server is not up.
const RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// How long a finished connection may take to get its last bytes out.
const LINGER: Duration = Duration::from_secs(2);
/// Client: pause between the MPA Reply and the first SEND. Linux siw's
/// `siw_accept()` sends its MPA Reply before it hooks the QP to the socket;
/// an FPDU arriving in that window is never read (the server hangs, see
/// ci/README.md "siw: rdma_cm connection setup is flaky"). The real tool
/// is slow enough not to hit it; we wait a little instead.
pub const FIRST_SEND_DELAY: Duration = Duration::from_millis(300);

const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;
const WR_READ: u64 = 3;
const WR_WRITE: u64 = 4;

/// The buffer rping's client fills for ping `k` (`size` bytes).
pub fn ping_buffer(k: u32, size: usize) -> Vec<u8> {
    let mut b = vec![0u8; size];
    let head = format!("rdma-ping-{}: ", k as i32);
    let n = head.len().min(size.saturating_sub(1));
    b[..n].copy_from_slice(&head.as_bytes()[..n]);
    let mut c = b'A' + (k % 58) as u8;
    for x in b.iter_mut().skip(head.len()) {
        *x = c;
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    if let Some(last) = b.last_mut() {
        *last = 0;
    }
    b
}

/// rping's buffer advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufInfo {
    /// Address (the tool's virtual address).
    pub addr: u64,
    /// STag.
    pub rkey: u32,
    /// Length.
    pub len: u32,
}

impl BufInfo {
    /// Wire form (big-endian).
    pub fn encode(&self) -> [u8; INFO_LEN] {
        let mut b = [0u8; INFO_LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Parses the wire form.
    pub fn decode(b: &[u8]) -> Option<BufInfo> {
        let b: &[u8; INFO_LEN] = b.get(..INFO_LEN)?.try_into().ok()?;
        Some(BufInfo {
            addr: u64::from_be_bytes(b[..8].try_into().ok()?),
            rkey: u32::from_be_bytes(b[8..12].try_into().ok()?),
            len: u32::from_be_bytes(b[12..].try_into().ok()?),
        })
    }
}

/// Which tool's protocol the service speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// `rping` (RDMA READ / WRITE ping-pong, above).
    Rping,
    /// `ucmatose` (librdmacm examples/cmatose.c): both sides post `-C`
    /// receives of `-S` bytes before connecting; the server SENDs `-C`
    /// messages, the client answers with as many once it has them all, the
    /// server disconnects. Contents are not checked by the tool; we check
    /// every message's length. Port 7471, 10 × 100 bytes.
    Ucmatose,
}

/// Most ucmatose messages per session (all receives are posted at once).
pub const UCMATOSE_MAX_COUNT: u32 = 512;

/// Which side we play.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `rping -s`.
    Server,
    /// `rping -c`.
    Client,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Listening,
    Connecting,
    RetryWait,
    Running,
    /// Waiting for the last bytes to leave before the socket is dropped.
    Lingering,
    Done,
}

/// rping's per-ping state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Connected,
    ReadAdv,
    ReadComplete,
    WriteAdv,
    WriteComplete,
}

/// Base addresses of our buffers (arbitrary, page aligned, like user VAs).
const RECV_VA: u64 = 0x7f10_0000_0000;
const SEND_VA: u64 = 0x7f20_0000_0000;
const RDMA_VA: u64 = 0x7f30_0000_0000;
const START_VA: u64 = 0x7f40_0000_0000;

struct Stags {
    recv: u32,
    send: u32,
    rdma: u32,
    start: u32,
}

struct Session {
    ep: Endpoint,
    /// The connection came up (a client retries a refused setup).
    connected: bool,
    peer: Ipv4Addr,
    step: Step,
    stags: Option<Stags>,
    remote: Option<BufInfo>,
    pings: u32,
    verified: u32,
    started: Instant,
    last_progress: Instant,
    error: Option<String>,
    closing: bool,
    first_ping_at: Option<Instant>,
    /// ucmatose: SENDs completed.
    sent: u32,
}

/// One rping service.
pub struct Rping {
    id: u32,
    proto: Proto,
    transport: TransportKind,
    role: Role,
    spec: ServiceSpec,
    /// The time of the current `step` (for closes deep in completion handling).
    now: Instant,
    sock: Option<SocketHandle>,
    phase: Phase,
    session: Option<Session>,
    retry_at: Option<Instant>,
    linger_until: Option<Instant>,
    connect_deadline: Instant,
    tally: SessionTally,
    counters: IwarpCounters,
}

impl Rping {
    pub(crate) fn start(
        id: u32,
        proto: Proto,
        role: Role,
        transport: TransportKind,
        spec: ServiceSpec,
        ctx: &mut ServiceCtx<'_>,
    ) -> Result<Self, HostError> {
        match proto {
            Proto::Rping if spec.size < MIN_SIZE || spec.size > MAX_SIZE => {
                return Err(HostError::Invalid(format!(
                    "rping size {} ({MIN_SIZE}..={MAX_SIZE})",
                    spec.size
                )));
            }
            Proto::Ucmatose if spec.size > MAX_SIZE || spec.iters > UCMATOSE_MAX_COUNT => {
                return Err(HostError::Invalid(format!(
                    "ucmatose size {} (..={MAX_SIZE}) or count {} (..={UCMATOSE_MAX_COUNT})",
                    spec.size, spec.iters
                )));
            }
            _ => {}
        }
        let sock = match transport {
            TransportKind::Iwarp => Some(ctx.new_tcp_socket()?),
            TransportKind::Roce => None,
        };
        let mut r = Rping {
            id,
            proto,
            transport,
            role,
            connect_deadline: ctx.now + spec.connect_timeout,
            now: ctx.now,
            spec,
            sock,
            phase: Phase::Listening,
            session: None,
            retry_at: None,
            linger_until: None,
            tally: SessionTally::default(),
            counters: IwarpCounters::default(),
        };
        match (role, sock) {
            (Role::Server, Some(sock)) => {
                tcp_listen(ctx, sock, r.spec.port)?;
            }
            (Role::Server, None) => {
                ctx.rdma
                    .cm_listen(ib_cm::service_id(ib_cm::RDMA_PS_TCP, r.spec.port), id)?;
            }
            (Role::Client, _) => {
                if let Err(e) = r.connect(ctx) {
                    if let Some(sock) = sock {
                        ctx.sockets.remove(sock);
                    }
                    return Err(e);
                }
            }
        }
        Ok(r)
    }

    /// iWARP counters of this service.
    pub fn counters(&self) -> IwarpCounters {
        self.counters
    }

    fn connect(&mut self, ctx: &mut ServiceCtx<'_>) -> Result<(), HostError> {
        if self.transport == TransportKind::Roce {
            let (peer, ep) = roce_connect(
                ctx,
                self.id,
                &self.spec,
                self.qp_caps(),
                RD_ATOMIC,
                crate::endpoint::DEFAULT_ACK_TIMEOUT,
            )?;
            self.begin(ctx, Endpoint::Roce(ep), peer);
            return Ok(());
        }
        let (peer, sock) = client_target(&self.spec, self.sock)?;
        tcp_connect(ctx, sock, peer, self.spec.port)?;
        self.phase = Phase::Connecting;
        Ok(())
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let s = self.session.as_ref();
        let idle = s
            .filter(|_| self.phase == Phase::Running)
            .map(|s| s.last_progress + IDLE_TIMEOUT);
        let setup = s.and_then(|s| s.ep.poll_timeout());
        let linger = self.linger_until;
        let first = s.and_then(|s| s.first_ping_at);
        [self.retry_at, idle, setup, linger, first]
            .into_iter()
            .flatten()
            .min()
    }

    pub(crate) fn teardown(
        &mut self,
        sockets: &mut SocketSet<'static>,
        rdma: &mut RdmaDevice,
        now: Instant,
    ) {
        if let Some(mut s) = self.session.take() {
            s.ep.release(rdma, now);
        }
        rdma.cm_release_owner(self.id, now);
        abort_sockets(sockets, self.sock.take());
        self.phase = Phase::Done;
    }

    pub(crate) fn status(&self, id: u32) -> ServiceStatus {
        let state = match self.phase {
            Phase::Listening => "listening",
            Phase::Connecting => "connecting",
            Phase::RetryWait => "waiting-for-server",
            Phase::Running => "running",
            Phase::Lingering => "closing",
            Phase::Done => self.tally.stopped_state(),
        };
        let peer = self.session.as_ref().map(|s| s.peer).or(self.spec.peer);
        let progress = self
            .session
            .as_ref()
            .map_or((0, 0), |s| (s.pings, s.verified));
        self.tally.status(id, &self.spec, peer, state, progress)
    }

    /// Runs the state machine; returns whether anything changed.
    pub(crate) fn step(&mut self, ctx: &mut ServiceCtx<'_>) -> bool {
        self.now = ctx.now;
        let before = (self.phase, self.progress_mark());
        let mut moved = false;
        if self.transport == TransportKind::Roce {
            moved |= dispatch_cm(self, self.id, ctx);
        }
        match self.phase {
            Phase::Listening => self.step_listen(ctx),
            Phase::Connecting => self.step_connect(ctx),
            Phase::RetryWait => {
                if self.retry_at.is_some_and(|t| ctx.now >= t) {
                    self.retry_at = None;
                    if let Err(e) = self.connect(ctx) {
                        self.record_failure(ctx, None, e.to_string());
                        self.phase = Phase::Done;
                    }
                }
            }
            Phase::Running => moved = self.step_run(ctx),
            Phase::Lingering => self.step_linger(ctx),
            Phase::Done => {}
        }
        moved || before != (self.phase, self.progress_mark())
    }

    /// QP sizes for a RoCE session.
    fn qp_caps(&self) -> QpCaps {
        let n = match self.proto {
            Proto::Rping => 4,
            Proto::Ucmatose => self.spec.iters as usize + 1,
        };
        QpCaps {
            max_send_wr: n.max(4),
            max_recv_wr: n.max(4),
            max_sge: 1,
            ..QpCaps::default()
        }
    }

    fn progress_mark(&self) -> (u32, u32) {
        self.session
            .as_ref()
            .map_or((0, 0), |s| (s.pings, s.step as u32))
    }

    fn step_listen(&mut self, ctx: &mut ServiceCtx<'_>) {
        let Some(h) = self.sock else { return };
        let sock = ctx.sockets.get_mut::<Socket>(h);
        let Some(peer) = accepted_peer(sock, self.spec.port, &mut self.tally.last_error) else {
            return;
        };
        let ep = IwarpEndpoint::responder(h, self.engine_config(), ctx.now);
        self.begin(ctx, Endpoint::Iwarp(Box::new(ep)), peer);
    }

    fn step_connect(&mut self, ctx: &mut ServiceCtx<'_>) {
        let Some(h) = self.sock else { return };
        let sock = ctx.sockets.get_mut::<Socket>(h);
        match sock.state() {
            State::Closed | State::TimeWait => {
                // Refused (the tool is not listening yet): try again.
                self.retry_later(ctx);
                return;
            }
            State::Established => {}
            _ => return,
        }
        let peer = self.spec.peer.unwrap_or(Ipv4Addr::UNSPECIFIED);
        let cfg = self.engine_config();
        // rdma_cm over iWARP: the MPA private data is the application's (none).
        match IwarpEndpoint::initiator(h, cfg, &[], ctx.now) {
            Ok(ep) => self.begin(ctx, Endpoint::Iwarp(Box::new(ep)), peer),
            Err(e) => {
                self.record_failure(ctx, Some(peer), format!("MPA request: {e}"));
                self.phase = Phase::Done;
            }
        }
    }

    fn engine_config(&self) -> siw::Config {
        let mut c = engine_config(self.spec.mpa_crc, 16, 16);
        if self.proto == Proto::Ucmatose {
            let n = self.spec.iters as usize + 1;
            c.sq_depth = c.sq_depth.max(n);
            c.rq_depth = c.rq_depth.max(n);
        }
        c
    }

    fn retry_later(&mut self, ctx: &mut ServiceCtx<'_>) {
        if let Some(h) = self.sock {
            ctx.sockets.get_mut::<Socket>(h).abort();
        }
        if ctx.now + RETRY_INTERVAL < self.connect_deadline {
            self.retry_at = Some(ctx.now + RETRY_INTERVAL);
            self.phase = Phase::RetryWait;
        } else {
            self.record_failure(ctx, self.spec.peer, "could not reach the server".into());
            self.phase = Phase::Done;
        }
    }

    /// Registers the buffers, posts the first receive and starts running.
    fn begin(&mut self, ctx: &mut ServiceCtx<'_>, mut ep: Endpoint, peer: Ipv4Addr) {
        let size = self.spec.size as usize;
        let rdma = &mut *ctx.rdma;
        let regs = [
            (INFO_LEN, RECV_VA, Access::LOCAL_WRITE),
            (INFO_LEN, SEND_VA, Access::NONE),
            // Server: READ sink and WRITE source. Client: WRITE sink.
            (size, RDMA_VA, Access::LOCAL_WRITE | Access::REMOTE_WRITE),
            // Client: READ source.
            (size, START_VA, Access::REMOTE_READ),
        ];
        let mut keys = [0u32; 4];
        let mut reg_error = None;
        for (k, (len, va, access)) in keys.iter_mut().zip(regs) {
            match ep.register(rdma, len, va, access) {
                Ok(key) => *k = key,
                Err(e) => {
                    reg_error = Some(format!("register: {e}"));
                    break;
                }
            }
        }
        let stags = Stags {
            recv: keys[0],
            send: keys[1],
            rdma: keys[2],
            start: keys[3],
        };
        let mut s = Session {
            ep,
            connected: false,
            peer,
            step: Step::Connected,
            stags: None,
            remote: None,
            pings: 0,
            verified: 0,
            started: ctx.now,
            last_progress: ctx.now,
            error: None,
            closing: false,
            first_ping_at: None,
            sent: 0,
        };
        s.error = reg_error;
        match self.proto {
            _ if s.error.is_some() => {}
            Proto::Rping => {
                if let Err(e) = post_recv(&mut s.ep, rdma, stags.recv) {
                    s.error = Some(format!("post receive: {e}"));
                }
            }
            Proto::Ucmatose => {
                // All of the tool's receives land in one buffer (`rdma`
                // here); it posts them before connecting.
                for _ in 0..self.spec.iters {
                    let r = s.ep.post_recv(
                        rdma,
                        WR_RECV,
                        Sge {
                            stag: stags.rdma,
                            addr: RDMA_VA,
                            len: self.spec.size,
                        },
                    );
                    if let Err(e) = r {
                        s.error = Some(format!("post receive: {e}"));
                        break;
                    }
                }
            }
        }
        s.stags = Some(stags);
        self.session = Some(s);
        self.phase = Phase::Running;
    }

    fn step_run(&mut self, ctx: &mut ServiceCtx<'_>) -> bool {
        let Some(mut s) = self.session.take() else {
            self.phase = Phase::Done;
            return true;
        };
        s.ep.handle_timeout(ctx.now);
        let mut moved = false;
        if s.first_ping_at.is_some_and(|t| ctx.now >= t) && s.error.is_none() {
            s.first_ping_at = None;
            s.last_progress = ctx.now;
            match self.proto {
                Proto::Rping => self.client_ping(&mut s, ctx.rdma),
                Proto::Ucmatose => self.post_messages(&mut s, ctx.rdma),
            }
            moved = true;
        }
        let mut closed = false;
        let mut refused = false;
        for _ in 0..64 {
            let mut round = s.ep.pump(ctx.sockets, ctx.rdma);
            while let Some(ev) = s.ep.poll_event() {
                round = true;
                s.last_progress = ctx.now;
                match ev {
                    EpEvent::ConnectRequest => {
                        // rping accepts without private data.
                        if s.ep.accept().is_err() {
                            s.error.get_or_insert("accept failed".into());
                        }
                    }
                    EpEvent::Connected { crc, qpns } => {
                        s.connected = true;
                        if self.transport == TransportKind::Iwarp {
                            self.counters.connected += 1;
                            if crc {
                                self.counters.connected_crc += 1;
                            }
                        }
                        s.started = ctx.now;
                        session_started(ctx, self.id, s.peer, qpns.0, qpns.1);
                        // Whoever sends first waits a little (see FIRST_SEND_DELAY;
                        // for a ucmatose server the guest's siw would otherwise
                        // see our FPDU right behind the MPA Reply: -EPROTO).
                        let sends_first = match self.proto {
                            Proto::Rping => self.role == Role::Client,
                            Proto::Ucmatose => self.role == Role::Server,
                        };
                        if sends_first {
                            s.first_ping_at = Some(ctx.now + FIRST_SEND_DELAY);
                        }
                    }
                    EpEvent::Rejected(why) => {
                        if self.role == Role::Client
                            && self.transport == TransportKind::Roce
                            && !s.connected
                        {
                            // Nobody listens yet (REJ, or no answer): retry.
                            refused = true;
                        } else {
                            s.error.get_or_insert(why);
                        }
                    }
                    EpEvent::Completion(c) => self.on_completion(&mut s, ctx.rdma, c),
                    EpEvent::Iwarp(e) => {
                        self.counters.count(&e);
                        s.error.get_or_insert(format!("iWARP: {e}"));
                    }
                    EpEvent::Closed => closed = true,
                }
            }
            if refused {
                break;
            }
            if s.error.is_some() && !s.closing {
                s.closing = true;
                s.ep.close(ctx.rdma, ctx.now);
                round = true;
            }
            moved |= round;
            if !round {
                break;
            }
        }
        if s.error.is_none()
            && !closed
            && ctx.now.saturating_duration_since(s.last_progress) >= IDLE_TIMEOUT
        {
            s.error = Some(format!(
                "no progress for {} s ({} pings)",
                IDLE_TIMEOUT.as_secs(),
                s.pings
            ));
            s.ep.close(ctx.rdma, ctx.now);
            s.ep.pump(ctx.sockets, ctx.rdma);
            closed = true;
        }
        if refused {
            s.ep.release(ctx.rdma, ctx.now);
            self.retry_later(ctx);
            return true;
        }
        if closed || s.ep.is_finished() {
            self.finish(ctx, s);
            return true;
        }
        self.session = Some(s);
        moved
    }

    fn finish(&mut self, ctx: &mut ServiceCtx<'_>, mut s: Session) {
        // Let the last bytes (our FIN, a Terminate) leave.
        s.ep.pump(ctx.sockets, ctx.rdma);
        s.ep.release(ctx.rdma, ctx.now);
        let ok = match (self.proto, self.role) {
            (Proto::Rping, Role::Client) => s.pings >= self.spec.iters && s.error.is_none(),
            // The client ends a session by disconnecting.
            (Proto::Rping, Role::Server) => s.error.is_none() && s.pings > 0,
            (Proto::Ucmatose, Role::Server) => {
                s.error.is_none() && s.pings >= self.spec.iters && s.sent >= self.spec.iters
            }
            // The server disconnects only once it has all of our messages
            // (posted when we had all of its), so its disconnect may
            // overtake the ACK of our last SEND.
            (Proto::Ucmatose, Role::Client) => s.error.is_none() && s.pings >= self.spec.iters,
        };
        if ok {
            let elapsed = ctx.now.saturating_duration_since(s.started);
            self.tally
                .finished(ctx, self.id, s.peer, s.pings, s.verified, elapsed);
        } else {
            let reason = s.error.clone().unwrap_or_else(|| {
                format!(
                    "connection closed after {} of {} pings",
                    s.pings,
                    match self.role {
                        Role::Client => self.spec.iters.to_string(),
                        Role::Server => "?".into(),
                    }
                )
            });
            self.tally.last_iterations = s.pings;
            self.tally.last_verified = s.verified;
            self.record_failure(ctx, Some(s.peer), reason);
        }
        self.linger_until = Some(ctx.now + LINGER);
        self.phase = Phase::Lingering;
    }

    fn record_failure(&mut self, ctx: &mut ServiceCtx<'_>, peer: Option<Ipv4Addr>, reason: String) {
        self.tally.failed(ctx, self.id, peer, reason);
    }

    fn step_linger(&mut self, ctx: &mut ServiceCtx<'_>) {
        let Some(h) = self.sock else {
            // RoCE: the QP retires on its own; the CM handshake is over.
            self.linger_until = None;
            self.phase = match self.role {
                Role::Server => Phase::Listening,
                Role::Client => Phase::Done,
            };
            return;
        };
        let sock = ctx.sockets.get_mut::<Socket>(h);
        drain_and_close(sock);
        let drained = matches!(
            sock.state(),
            State::Closed | State::TimeWait | State::FinWait2
        );
        if !drained && self.linger_until.is_some_and(|t| ctx.now < t) {
            return;
        }
        self.linger_until = None;
        match self.role {
            Role::Server => {
                sock.abort();
                self.phase = Phase::Listening;
            }
            Role::Client => self.phase = Phase::Done,
        }
    }

    /// Client: advertise the source buffer of the next ping.
    fn client_ping(&mut self, s: &mut Session, dev: &mut RdmaDevice) {
        let Some(st) = s.stags.as_ref() else { return };
        let (start, rdma) = (st.start, st.rdma);
        let size = self.spec.size as usize;
        let buf = ping_buffer(s.pings, size);
        let r =
            s.ep.mem_write(dev, start, START_VA, &buf)
                // A fresh sink, so the comparison shows the server's WRITE.
                .and_then(|_| s.ep.mem_write(dev, rdma, RDMA_VA, &vec![0; size]));
        if r.is_err() {
            s.error.get_or_insert("local buffer".into());
            return;
        }
        s.step = Step::ReadAdv;
        self.send_info(s, dev, START_VA, start);
    }

    fn send_info(&self, s: &mut Session, dev: &mut RdmaDevice, addr: u64, rkey: u32) {
        let Some(send) = s.stags.as_ref().map(|t| t.send) else {
            return;
        };
        let info = BufInfo {
            addr,
            rkey,
            len: self.spec.size,
        };
        self.send_raw(s, dev, send, &info.encode());
    }

    fn send_raw(&self, s: &mut Session, dev: &mut RdmaDevice, send: u32, msg: &[u8; INFO_LEN]) {
        let ep = &mut s.ep;
        let r = ep.mem_write(dev, send, SEND_VA, msg).and_then(|_| {
            ep.post_send(
                dev,
                WR_SEND,
                WorkRequest::Send {
                    local: Sge {
                        stag: send,
                        addr: SEND_VA,
                        len: INFO_LEN as u32,
                    },
                    solicited: false,
                    invalidate: None,
                },
            )
        });
        if let Err(e) = r {
            s.error.get_or_insert(format!("post send: {e}"));
        }
    }

    /// ucmatose: post every SEND of the session (the tool's message buffer
    /// is uninitialised; ours carries a counter pattern).
    fn post_messages(&mut self, s: &mut Session, dev: &mut RdmaDevice) {
        let Some(send_buf) = s.stags.as_ref().map(|t| t.start) else {
            return;
        };
        let size = self.spec.size as usize;
        let fill: Vec<u8> = (0..size).map(|i| i as u8).collect();
        if s.ep.mem_write(dev, send_buf, START_VA, &fill).is_err() {
            s.error.get_or_insert("local buffer".into());
            return;
        }
        for _ in 0..self.spec.iters {
            let r = s.ep.post_send(
                dev,
                WR_SEND,
                WorkRequest::Send {
                    local: Sge {
                        stag: send_buf,
                        addr: START_VA,
                        len: self.spec.size,
                    },
                    solicited: false,
                    invalidate: None,
                },
            );
            if let Err(e) = r {
                s.error.get_or_insert(format!("post send: {e}"));
                return;
            }
        }
    }

    fn on_ucmatose_completion(&mut self, s: &mut Session, dev: &mut RdmaDevice, c: Completion) {
        let n = self.spec.iters;
        match c.opcode {
            WcOpcode::Recv => {
                if c.byte_len != self.spec.size {
                    s.error = Some(format!(
                        "message {} of {} bytes, expected {}",
                        s.pings, c.byte_len, self.spec.size
                    ));
                    return;
                }
                s.pings += 1;
                s.verified += 1;
                if self.role == Role::Client && s.pings == n {
                    // The client answers once it has every message.
                    self.post_messages(s, dev);
                }
            }
            WcOpcode::Send => s.sent += 1,
            op => {
                s.error = Some(format!("unexpected {op:?} completion"));
                return;
            }
        }
        if self.role == Role::Server && s.pings >= n && s.sent >= n && !s.closing {
            // The server disconnects when both directions are done.
            s.closing = true;
            s.ep.close(dev, self.now);
        }
    }

    fn on_completion(&mut self, s: &mut Session, dev: &mut RdmaDevice, c: Completion) {
        if s.error.is_some() {
            return;
        }
        if c.status == WcStatus::Flushed {
            // Work left over when the connection ends (the peer's
            // disconnect flushes our posted receive).
            return;
        }
        if c.status != WcStatus::Success {
            s.error = Some(format!("{:?} completion: {:?}", c.opcode, c.status));
            return;
        }
        if self.proto == Proto::Ucmatose {
            self.on_ucmatose_completion(s, dev, c);
            return;
        }
        let Some(st) = s.stags.as_ref() else { return };
        let (recv, send, rdma, start) = (st.recv, st.send, st.rdma, st.start);
        let size = self.spec.size as usize;
        match (self.role, c.opcode) {
            (_, WcOpcode::Send) => {}
            (Role::Server, WcOpcode::Recv) => {
                if c.byte_len as usize != INFO_LEN {
                    s.error = Some(format!(
                        "received {} bytes, expected {INFO_LEN}",
                        c.byte_len
                    ));
                    return;
                }
                let info =
                    s.ep.mem_read(dev, recv, RECV_VA, INFO_LEN)
                        .as_deref()
                        .and_then(BufInfo::decode);
                let Some(info) = info else {
                    s.error = Some("cannot read the receive buffer".into());
                    return;
                };
                if let Err(e) = post_recv(&mut s.ep, dev, recv) {
                    s.error = Some(format!("post receive: {e}"));
                    return;
                }
                s.remote = Some(info);
                match s.step {
                    Step::Connected | Step::WriteComplete => {
                        // Source advertised: READ it (at most our buffer).
                        if info.len == 0 || info.len as usize > size {
                            s.error = Some(format!(
                                "client buffer of {} bytes (ours is {size})",
                                info.len
                            ));
                            return;
                        }
                        s.step = Step::ReadAdv;
                        let r = s.ep.post_send(
                            dev,
                            WR_READ,
                            WorkRequest::Read {
                                local: Sge {
                                    stag: rdma,
                                    addr: RDMA_VA,
                                    len: info.len,
                                },
                                remote_stag: info.rkey,
                                remote_addr: info.addr,
                            },
                        );
                        if let Err(e) = r {
                            s.error = Some(format!("post read: {e}"));
                        }
                    }
                    Step::ReadComplete => {
                        // Sink advertised: WRITE the string back.
                        s.step = Step::WriteAdv;
                        let data = s.ep.mem_read(dev, rdma, RDMA_VA, size).unwrap_or_default();
                        let len = data.iter().position(|&b| b == 0).map_or(size, |n| n + 1);
                        let r = s.ep.post_send(
                            dev,
                            WR_WRITE,
                            WorkRequest::Write {
                                local: Sge {
                                    stag: rdma,
                                    addr: RDMA_VA,
                                    len: len as u32,
                                },
                                remote_stag: info.rkey,
                                remote_addr: info.addr,
                            },
                        );
                        if let Err(e) = r {
                            s.error = Some(format!("post write: {e}"));
                        }
                    }
                    other => {
                        s.error = Some(format!(
                            "unexpected SEND from the client in state {other:?}"
                        ));
                    }
                }
            }
            (Role::Server, WcOpcode::Read) => {
                s.step = Step::ReadComplete;
                let len = s.remote.map_or(0, |r| r.len as usize);
                let got = s.ep.mem_read(dev, rdma, RDMA_VA, len).unwrap_or_default();
                if !self.spec.echo {
                    if got != ping_buffer(s.pings, len) {
                        s.error = Some(format!(
                            "ping {}: the client's buffer is not rping's pattern",
                            s.pings
                        ));
                        return;
                    }
                    s.verified += 1;
                }
                self.send_raw(s, dev, send, &[0; INFO_LEN]);
            }
            (Role::Server, WcOpcode::Write) => {
                s.step = Step::WriteComplete;
                s.pings += 1;
                self.send_raw(s, dev, send, &[0; INFO_LEN]);
            }
            (Role::Client, WcOpcode::Recv) => {
                if c.byte_len as usize != INFO_LEN {
                    s.error = Some(format!(
                        "received {} bytes, expected {INFO_LEN}",
                        c.byte_len
                    ));
                    return;
                }
                if let Err(e) = post_recv(&mut s.ep, dev, recv) {
                    s.error = Some(format!("post receive: {e}"));
                    return;
                }
                match s.step {
                    Step::ReadAdv => {
                        s.step = Step::WriteAdv;
                        self.send_info(s, dev, RDMA_VA, rdma);
                    }
                    Step::WriteAdv => {
                        s.step = Step::WriteComplete;
                        let a = s.ep.mem_read(dev, start, START_VA, size);
                        let b = s.ep.mem_read(dev, rdma, RDMA_VA, size);
                        let same = matches!((a, b), (Some(a), Some(b)) if a == b);
                        if !same {
                            s.error = Some(format!("ping {}: data mismatch", s.pings));
                            return;
                        }
                        s.verified += 1;
                        s.pings += 1;
                        if s.pings >= self.spec.iters {
                            // rdma_disconnect: a graceful close.
                            s.ep.close(dev, self.now);
                        } else {
                            self.client_ping(s, dev);
                        }
                    }
                    other => {
                        s.error = Some(format!(
                            "unexpected SEND from the server in state {other:?}"
                        ));
                    }
                }
            }
            (Role::Client, op) => {
                s.error = Some(format!("unexpected {op:?} completion"));
            }
        }
    }
}

/// Posts the receive for the peer's next buffer info.
fn post_recv(ep: &mut Endpoint, dev: &mut RdmaDevice, stag: u32) -> Result<(), EndpointError> {
    ep.post_recv(
        dev,
        WR_RECV,
        Sge {
            stag,
            addr: RECV_VA,
            len: INFO_LEN as u32,
        },
    )
}

/// RoCE, through [`dispatch_cm`]: the CM's events go to the session, or
/// accept a new one.
impl CmService for Rping {
    fn cm_request(&mut self, ctx: &mut ServiceCtx<'_>, request: CmRequest) {
        let CmRequest { conn, peer, remote } = request;
        if self.role != Role::Server || self.phase != Phase::Listening || self.session.is_some() {
            // One client at a time, as the tools serve.
            ctx.rdma
                .cm_reject(conn, ib_cm::reject_reason::CONSUMER_DEFINED);
            return;
        }
        let psn = ctx.rng.next_u64() as u32;
        match RoceEndpoint::accept(
            ctx.rdma,
            conn,
            peer,
            &remote,
            self.qp_caps(),
            RD_ATOMIC,
            psn,
            crate::endpoint::DEFAULT_ACK_TIMEOUT,
            ctx.now,
        ) {
            Ok(ep) => self.begin(ctx, Endpoint::Roce(ep), peer),
            Err(e) => self.record_failure(ctx, Some(peer), e.to_string()),
        }
    }

    fn cm_event(&mut self, ctx: &mut ServiceCtx<'_>, conn: ConnId, other: CmEvent) {
        if let Some(s) = self.session.as_mut() {
            let rdma = &mut *ctx.rdma;
            if let Some(r) = s.ep.roce().filter(|r| r.conn() == conn) {
                r.on_cm(rdma, other);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_buffer_is_rpings_text() {
        let b = ping_buffer(0, 32);
        assert_eq!(&b[..], b"rdma-ping-0: ABCDEFGHIJKLMNOPQR\0");
        let b = ping_buffer(1, 20);
        assert_eq!(&b[..], b"rdma-ping-1: BCDEFG\0");
        // The start letter wraps from 'z' back to 'A' after 58 pings.
        assert_eq!(ping_buffer(58, 20)[14], b'A');
        assert_eq!(ping_buffer(57, 20)[14], b'z');
        // Short buffers are truncated like snprintf.
        assert_eq!(&ping_buffer(12345, 8)[..], b"rdma-pi\0");
    }

    #[test]
    fn buf_info_round_trips_big_endian() {
        let i = BufInfo {
            addr: 0x0102_0304_0506_0708,
            rkey: 0x0a0b_0c0d,
            len: 64,
        };
        let w = i.encode();
        assert_eq!(&w[..9], &[1, 2, 3, 4, 5, 6, 7, 8, 0x0a]);
        assert_eq!(BufInfo::decode(&w), Some(i));
        assert_eq!(BufInfo::decode(&w[..15]), None);
    }
}
